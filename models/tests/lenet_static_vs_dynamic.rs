//! The `#[model]` LeNet (conv, batch norm, pooling, dropout) against the same layers
//! run on the runtime tape: loss, every parameter gradient and the batch-norm
//! running-statistics updates must agree (static path against dynamic path).

use kiln::autodiff::{Tape, Var};
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::{step_seed, LayerSpec, Mode as LayerMode, Slot};
use kiln::tensor::{DType, RandDist};
use kiln_models::lenet::LeNet;
use std::collections::HashMap;

fn max_diff(a: &RawTensor<Cpu>, b: &RawTensor<Cpu>) -> Result<f32> {
    let (a, b) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    assert_eq!(a.len(), b.len());
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max))
}

#[test]
fn lenet_gradients_match_the_tape() -> Result<()> {
    let dev = CpuDevice;
    let model = LeNet::<Cpu>::init(&dev, 11)?;
    let mut params: HashMap<String, RawTensor<Cpu>> = HashMap::new();
    model.visit_params("", &mut |s: Slot<'_, Cpu>| {
        params.insert(s.name.to_string(), s.value.clone());
    });
    model.visit_buffers("", &mut |s: Slot<'_, Cpu>| {
        params.insert(s.name.to_string(), s.value.clone());
    });
    let x = RawTensor::<Cpu>::rand(
        &[4, 1, 28, 28],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        9,
        DType::F32,
        &dev,
    )?;
    let y = RawTensor::<Cpu>::from_vec(vec![3i32, 1, 4, 1], &[4], &dev)?;

    let seed = step_seed(model.step_seeds().steps());
    let (loss, grads) =
        model.loss_and_grad::<4>(&Tensor::from_raw(x.clone())?, &Tensor::from_raw(y.clone())?)?;

    let mut tape = Tape::<Cpu>::new(dev);
    let mut leaves: HashMap<String, Var<Cpu>> = HashMap::new();
    for (name, t) in &params {
        let v = if name.contains("running") {
            tape.constant(t.clone())
        } else {
            tape.leaf(t.clone())
        };
        leaves.insert(name.clone(), v);
    }
    let mut updates = Vec::new();
    let mut dropouts = 0u64;
    let mut layer =
        |tape: &mut Tape<Cpu>, name: &str, spec: LayerSpec, h: Var<Cpu>| -> Result<Var<Cpu>> {
            let mut p: Vec<&Var<Cpu>> = spec
                .params()
                .iter()
                .map(|ps| &leaves[&format!("{name}.{}", ps.name)])
                .collect();
            p.extend(
                spec.buffers()
                    .iter()
                    .map(|ps| &leaves[&format!("{name}.{}", ps.name)]),
            );
            let ordinal = dropouts;
            if matches!(spec, LayerSpec::Dropout { .. }) {
                dropouts += 1;
            }
            let out = spec.forward(
                tape,
                &p,
                &h,
                LayerMode::Train {
                    seed: seed ^ ordinal,
                },
            )?;
            for (buffer, v) in out.updates {
                updates.push((format!("{name}.{buffer}"), v));
            }
            Ok(out.y)
        };
    let h = tape.constant(x);
    let h = layer(
        &mut tape,
        "conv1",
        LayerSpec::Conv2d {
            inputs: 1,
            outputs: 32,
            kernel: 5,
            stride: 1,
            padding: 2,
            groups: 1,
        },
        h,
    )?;
    let h = layer(&mut tape, "bn1", LayerSpec::BatchNorm2d { channels: 32 }, h)?;
    let h = tape.relu(&h)?;
    let h = layer(
        &mut tape,
        "pool1",
        LayerSpec::MaxPool2d {
            kernel: 2,
            stride: 2,
        },
        h,
    )?;
    let h = layer(
        &mut tape,
        "conv2",
        LayerSpec::Conv2d {
            inputs: 32,
            outputs: 64,
            kernel: 5,
            stride: 1,
            padding: 0,
            groups: 1,
        },
        h,
    )?;
    let h = layer(&mut tape, "bn2", LayerSpec::BatchNorm2d { channels: 64 }, h)?;
    let h = tape.relu(&h)?;
    let h = layer(
        &mut tape,
        "pool2",
        LayerSpec::MaxPool2d {
            kernel: 2,
            stride: 2,
        },
        h,
    )?;
    let h = tape.reshape(&h, vec![4, 1600])?;
    let h = layer(
        &mut tape,
        "fc1",
        LayerSpec::Linear {
            inputs: 1600,
            outputs: 128,
        },
        h,
    )?;
    let h = tape.relu(&h)?;
    let h = layer(&mut tape, "drop", LayerSpec::Dropout { percent: 25 }, h)?;
    let logits = layer(
        &mut tape,
        "fc2",
        LayerSpec::Linear {
            inputs: 128,
            outputs: 10,
        },
        h,
    )?;
    let yv = tape.constant(y);
    let l = tape.cross_entropy(&logits, &yv, 0.0)?;
    let tg = tape.gradients(&l)?;

    assert!((l.value().scalar_value()? - loss.to_vec()?[0] as f64).abs() < 1e-5);
    let ours = [
        ("conv1.weight", grads.conv1.weight.raw()),
        ("conv1.bias", grads.conv1.bias.raw()),
        ("bn1.weight", grads.bn1.weight.raw()),
        ("bn1.bias", grads.bn1.bias.raw()),
        ("conv2.weight", grads.conv2.weight.raw()),
        ("conv2.bias", grads.conv2.bias.raw()),
        ("bn2.weight", grads.bn2.weight.raw()),
        ("bn2.bias", grads.bn2.bias.raw()),
        ("fc1.weight", grads.fc1.weight.raw()),
        ("fc1.bias", grads.fc1.bias.raw()),
        ("fc2.weight", grads.fc2.weight.raw()),
        ("fc2.bias", grads.fc2.bias.raw()),
    ];
    for (name, g) in ours {
        let want = tg
            .get(&leaves[name])
            .expect("every parameter has a gradient");
        let d = max_diff(g, want)?;
        assert!(d < 1e-5, "{name}: max difference {d}");
    }
    // The training step stored the same running statistics the tape computed.
    let mut stored: HashMap<String, RawTensor<Cpu>> = HashMap::new();
    model.visit_buffers("", &mut |s: Slot<'_, Cpu>| {
        stored.insert(s.name.to_string(), s.value.clone());
    });
    assert_eq!(updates.len(), 4);
    for (name, v) in &updates {
        let d = max_diff(&stored[name.as_str()], v.value())?;
        assert!(d < 1e-6, "{name}: max difference {d}");
    }
    Ok(())
}
