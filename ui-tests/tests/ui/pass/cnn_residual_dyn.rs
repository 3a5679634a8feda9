use kiln::prelude::*;

#[model]
struct Cnn {
    conv: Conv2d<1, 4, 3, 1, 1>,
    // Padding written out as 0 (a strided 1×1 shortcut).
    down: Conv2d<1, 4, 1, 2, 0>,
    bn: BatchNorm2d<4>,
    pool: AvgPool2d<2>,
    blocks: [Linear<64, 64>; 2],
    norm: LayerNorm<64>,
    drop: Dropout<10>,
    head: Linear<64, 5>,
}

#[model]
impl Cnn {
    fn features<const B: usize>(&self, x: Tensor<B, 1, 8, 8>) -> Tensor<B, 64> {
        let h = self.pool(self.bn(self.conv(x)).relu());
        h.flatten()
    }

    fn forward<const B: usize>(&self, x: Tensor<B, 1, 8, 8>) -> Tensor<B, 5> {
        let mut h = self.features(x);
        for block in &self.blocks {
            h = h + block(h).gelu();
        }
        self.head(self.drop(self.norm(h)))
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 1, 8, 8>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy_smoothed(y, 0.1)
    }

    fn downsample<const B: usize>(&self, x: Tensor<B, 1, 8, 8>) -> Tensor<B, 4, 4, 4> {
        self.down(x)
    }

    fn logits_dyn(&self, x: Tensor<Dyn, 64>) -> Tensor<Dyn, 5> {
        self.head(x)
    }
}

fn main() -> Result<()> {
    let dev = CpuDevice;
    let m = Cnn::<Cpu>::init(&dev, 3)?;
    let x = Tensor::<Cpu, Rank4<2, 1, 8, 8>>::normal(0.0, 1.0, 4, &dev)?;
    let y = Tensor::<Cpu, (Const<2>,), i32>::from_slice(&[1, 4], &dev)?;
    let (_loss, grads) = m.loss_and_grad(&x, &y)?;
    assert_eq!(grads.blocks[1].bias.dims().as_slice(), &[64]);
    assert_eq!(m.downsample(&x)?.dims().as_slice(), &[2, 4, 4, 4]);
    let d = Tensor::<Cpu, Batch<64>>::full_dims(&[3, 64], 0.0, &dev)?;
    assert_eq!(m.logits_dyn(&d)?.dims().as_slice(), &[3, 5]);
    Ok(())
}
