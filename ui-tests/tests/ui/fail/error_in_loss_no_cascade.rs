use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 2>,
}

#[model]
impl Net {
    // One mistake here is one error: callers of `loss` and `loss_and_grad` see none.
    fn loss<const B: usize>(&self, x: Tensor<B, 4>, y: Tensor<B, 3>) -> Tensor {
        self.fc(x).mse(y)
    }
}

fn train(net: &Net<Cpu>, x: &Tensor<Cpu, (Const<8>, Const<4>)>, y: &Tensor<Cpu, (Const<8>, Const<3>)>) {
    let (loss, grads) = net.loss_and_grad(x, y).unwrap();
    let _ = (loss, grads.fc.weight);
    let _ = net.loss(x, y);
}

fn main() {}
