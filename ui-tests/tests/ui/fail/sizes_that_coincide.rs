use kiln::prelude::*;

// `q.matmul(k)` without the transpose checks at `Heads<128, 4, 32>`, where the head
// width `D / H` happens to equal the context `T`: the definition is checked where it is
// written with stand-in sizes that part them, so the mistake is reported there.
#[model]
struct Heads<const D: usize, const H: usize, const T: usize> {
    qkv: Linear<D, { 3 * D }>,
}

#[model]
impl<const D: usize, const H: usize, const T: usize> Heads<D, H, T> {
    fn scores<const B: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, H, T, T> {
        let q = self.qkv(x).reshape::<B, T, 3, H, { D / H }>().permute::<2, 0, 3, 1, 4>();
        let q = q.reshape::<3, B, H, T, { D / H }>();
        let (k, q) = (q.sum::<0>(), q.mean::<0>());
        q.matmul(k)
    }
}

#[model]
type Coinciding = Heads<128, 4, 32>;

// Two sizes of one degree that happen to be equal (`T` and `D`, both 32) part at the
// stand-in sizes.
#[model]
struct Rows<const T: usize, const D: usize> {
    fc: Linear<D, D>,
}

#[model]
impl<const T: usize, const D: usize> Rows<T, D> {
    fn mixed<const B: usize>(&self, x: Tensor<B, T>) -> Tensor<B, D> {
        self.fc(x)
    }
}

#[model]
type SameNumbers = Rows<32, 32>;

// Sizes the code makes equal stay equal, whatever their numbers.
#[model]
struct Square<const N: usize> {
    fc: Linear<N, N>,
}

#[model]
impl<const N: usize> Square<N> {
    fn gram<const B: usize>(&self, x: Tensor<B, N, N>) -> Tensor<B, N, N> {
        self.fc(x).matmul(x)
    }
}

#[model]
type Sixteen = Square<16>;

// Stand-in sizes (64, 320, 448 or 704 times powers of 3) cannot give `D / 13` whole,
// so this definition is checked at its instance only: there `D / 13` and `T` are both
// 16, and the instance is checked again with its sizes varied, which parts them.
#[model]
struct Thirteenths<const T: usize, const D: usize> {
    fc: Linear<{ D / 13 }, D>,
}

#[model]
impl Thirteenths {
    fn widen<const B: usize>(&self, x: Tensor<B, T>) -> Tensor<B, D> {
        self.fc(x)
    }
}

#[model]
type SixteenAnd208 = Thirteenths<16, 208>;

// The instances still work at their own numbers: their callers get no errors.
fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let model = Coinciding::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank3<2, 32, 128>>::zeros(&CpuDevice).unwrap();
    let _scores = model.scores(&x).unwrap();
    let model = SixteenAnd208::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 16>>::zeros(&CpuDevice).unwrap();
    let _wide = model.widen(&x).unwrap();
}
