//! The `#[model]` MLP's build-time gradients against the runtime tape's on the same
//! parameters and batch (static path against dynamic path), and its typed forward
//! against the eager layers.

use kiln::autodiff::Tape;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Slot;
use kiln::tensor::{DType, RandDist};
use kiln_models::mlp::Mlp;

#[test]
fn loss_and_grad_matches_the_tape() -> Result<()> {
    let dev = CpuDevice;
    let model = Mlp::<Cpu>::init(&dev, 7)?;
    let x = RawTensor::<Cpu>::rand(
        &[8, 784],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        3,
        DType::F32,
        &dev,
    )?;
    let labels: Vec<i32> = (0..8).map(|i| (i * 3) % 10).collect();
    let y = RawTensor::<Cpu>::from_vec(labels, &[8], &dev)?;
    let xt = Tensor::<Cpu, Rank2<8, 784>>::from_raw(x.clone())?;
    let yt = Tensor::<Cpu, (Const<8>,), i32>::from_raw(y.clone())?;

    let (loss, grads) = model.loss_and_grad(&xt, &yt)?;
    assert_eq!(loss.to_vec()?[0], model.loss(&xt, &yt)?.to_vec()?[0]);

    // The same computation on the tape, from the layers' specs.
    let mut tape = Tape::<Cpu>::new(dev);
    let mut leaves = Vec::new();
    model.visit_params("", &mut |s: Slot<'_, Cpu>| {
        leaves.push((s.name.to_string(), s.value.clone()))
    });
    let vars: Vec<_> = leaves.iter().map(|(_, v)| tape.leaf(v.clone())).collect();
    let xv = tape.constant(x);
    let yv = tape.constant(y);
    let h = tape.linear(&xv, &vars[0], Some(&vars[1]))?;
    let h = tape.relu(&h)?;
    let h = tape.linear(&h, &vars[2], Some(&vars[3]))?;
    let h = tape.relu(&h)?;
    let logits = tape.linear(&h, &vars[4], Some(&vars[5]))?;
    let l = tape.cross_entropy(&logits, &yv, 0.0)?;
    let tg = tape.gradients(&l)?;
    assert!((l.value().scalar_value()? - loss.to_vec()?[0] as f64).abs() < 1e-6);

    let ours = [
        grads.fc1.weight.raw(),
        grads.fc1.bias.raw(),
        grads.fc2.weight.raw(),
        grads.fc2.bias.raw(),
        grads.fc3.weight.raw(),
        grads.fc3.bias.raw(),
    ];
    for ((name, _), (v, g)) in leaves.iter().zip(vars.iter().zip(ours)) {
        let want = tg
            .get(v)
            .expect("every parameter has a gradient")
            .to_vec::<f32>()?;
        let got = g.to_vec::<f32>()?;
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "{name}: max difference {worst}");
    }
    Ok(())
}
