// An int8 instance is for inference: asking it for `loss_and_grad` is refused by
// saying so, not answered with rustc's "did you mean `loss_and_grads`".

use kiln::prelude::*;

#[model]
struct Mlp {
    fc: Linear<4, 3>,
}

#[model]
impl Mlp {
    fn loss<const B: usize>(&self, x: Tensor<B, 4>, y: Tensor<B, i32>) -> Tensor {
        self.fc(x).cross_entropy(y)
    }
}

#[model(precision = int8)]
type MlpInt8 = Mlp;

fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let model = MlpInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 4>>::zeros(&CpuDevice).unwrap();
    let y = Tensor::<Cpu, Rank1<2>, i32>::zeros(&CpuDevice).unwrap();
    let _ = model.loss(&x, &y);
    let _ = model.loss_and_grad(&x, &y);
}
