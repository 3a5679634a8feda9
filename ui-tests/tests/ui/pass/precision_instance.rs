//! A precision is set per instance: the same definition in f32 and with bf16 products.
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;

#[model]
struct Block<const D: usize> {
    fc: Linear<D, D>,
}

#[model]
impl Block {
    fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.fc(x).relu()
    }
}

#[model]
type Block8 = Block<8>;
#[model(precision = bf16)]
type Block8Bf16 = Block<8>;

fn main() {
    let x = Tensor::<Cpu, Rank2<2, 8>>::normal(0.0, 1.0, 1, &CpuDevice).unwrap();
    let exact = Block8::<Cpu>::init(&CpuDevice, 3).unwrap().forward(&x).unwrap();
    let mixed = Block8Bf16::<Cpu>::init(&CpuDevice, 3).unwrap().forward(&x).unwrap();
    assert_eq!(exact.dims(), mixed.dims());
}
