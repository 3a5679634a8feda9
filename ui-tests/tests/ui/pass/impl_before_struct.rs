use kiln::prelude::*;

// The impl may come before its struct: the struct's expansion gives the impl a path
// to its fields, whatever the order in the module.
#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 2> {
        self.fc(x)
    }
}

#[model]
struct Net {
    fc: Linear<8, 2>,
}

fn main() -> Result<()> {
    let dev = CpuDevice;
    let net = Net::<Cpu>::init(&dev, 1)?;
    let x = Tensor::<Cpu, Rank2<3, 8>>::normal(0.0, 1.0, 2, &dev)?;
    assert_eq!(net.forward(&x)?.dims().as_slice(), &[3, 2]);
    Ok(())
}
