// A caller's wrong input against a model kiln-import wrote (import/tests/expected,
// PyTorch's MLP of 20 features): 784 features is a build error at the call.
use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::{Rank2, Tensor as Typed};

mod imported {
    include!("../../../../import/tests/expected/mlp.rs");
}

fn main() {
    let model = imported::Mlp::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Typed::<Cpu, Rank2<3, 784>>::zeros(&CpuDevice).unwrap();
    let _ = model.forward(&x);
}
