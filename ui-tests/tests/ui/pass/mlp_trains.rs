use kiln::prelude::*;

#[model]
struct Mlp {
    fc1: Linear<8, 16>,
    fc2: Linear<16, 3>,
}

#[model]
impl Mlp {
    fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 3> {
        let h = self.fc1(x).relu();
        self.fc2(h)
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 8>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

fn main() -> Result<()> {
    let dev = CpuDevice;
    let m = Mlp::<Cpu>::init(&dev, 1)?;
    let x = Tensor::<Cpu, Rank2<4, 8>>::uniform(-1.0, 1.0, 2, &dev)?;
    let y = Tensor::<Cpu, (Const<4>,), i32>::from_slice(&[0, 1, 2, 0], &dev)?;
    let (loss, grads) = m.loss_and_grad(&x, &y)?;
    assert!(loss.to_vec()?[0] > 0.0);
    assert_eq!(grads.fc1.weight.dims().as_slice(), &[16, 8]);
    assert_eq!(m.forward(&x)?.dims().as_slice(), &[4, 3]);
    Ok(())
}
