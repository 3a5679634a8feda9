use kiln::prelude::*;

// Two `Dyn` sizes may be equal at run time: the macro leaves them to the run-time
// check instead of refusing them (`Dyn` against `Dyn` is not a mismatch).
#[model]
struct Net {
    fc: Linear<2, 2>,
}

#[model]
impl Net {
    fn error(&self, x: Tensor<Dyn, 2>, y: Tensor<Dyn, 2>) -> Tensor {
        self.fc(x).mse(y)
    }

    fn sum(&self, x: Tensor<Dyn, 2>, y: Tensor<Dyn, 2>) -> Tensor<Dyn, 2> {
        x + y
    }
}

fn main() -> Result<()> {
    let dev = CpuDevice;
    let net = Net::<Cpu>::init(&dev, 1)?;
    let x = Tensor::<Cpu, Batch<2>>::full_dims(&[3, 2], 1.0, &dev)?;
    let y = Tensor::<Cpu, Batch<2>>::full_dims(&[3, 2], 0.5, &dev)?;
    assert_eq!(net.error(&x, &y)?.dims().as_slice(), &[] as &[usize]);
    assert_eq!(net.sum(&x, &y)?.dims().as_slice(), &[3, 2]);
    let wrong = Tensor::<Cpu, Batch<2>>::full_dims(&[4, 2], 0.5, &dev)?;
    assert!(net.error(&x, &wrong).is_err());
    Ok(())
}
