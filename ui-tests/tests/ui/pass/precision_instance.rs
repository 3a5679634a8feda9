//! A precision is set per instance: the same definition in f32, with bf16 products,
//! with f16 products (whose training steps are loss-scaled) and with int8 weights (the
//! f32 model's of the same seed, quantised per row).
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
#[model(precision = f16)]
type Block8F16 = Block<8>;
#[model(precision = int8)]
type Block8Int8 = Block<8>;

fn main() {
    let x = Tensor::<Cpu, Rank2<2, 8>>::normal(0.0, 1.0, 1, &CpuDevice).unwrap();
    let exact = Block8::<Cpu>::init(&CpuDevice, 3).unwrap().forward(&x).unwrap();
    let mixed = Block8Bf16::<Cpu>::init(&CpuDevice, 3).unwrap().forward(&x).unwrap();
    assert_eq!(exact.dims(), mixed.dims());
    let half = Block8F16::<Cpu>::init(&CpuDevice, 3).unwrap();
    assert_eq!(half.forward(&x).unwrap().dims(), exact.dims());
    assert_eq!(half.loss_scale().scale(), 65536.0);
    let int8 = Block8Int8::<Cpu>::init(&CpuDevice, 3).unwrap().forward(&x).unwrap();
    let (int8, exact) = (int8.to_vec().unwrap(), exact.to_vec().unwrap());
    let spread = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in int8.iter().zip(&exact) {
        assert!((a - b).abs() <= 0.05 * spread, "int8 {a}, f32 {b}");
    }
}
