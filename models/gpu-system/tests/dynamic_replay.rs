//! Dynamic programs replayed as captured graphs in training: the dynamic MLP trained by
//! SGD with momentum and by AdamW replays its step programs and trains bit for bit as
//! with replay off. Runs on `Taped` (the CPU capturing as a graph does, so in CI) and,
//! with the `cuda` feature, on CUDA, where `kiln-dynamic`'s replay scenarios run too.

// Without CUDA only `both` and `wave` are used here (kiln-dynamic runs the rest on Taped).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[path = "../../../dynamic/tests/support/replay_scenarios.rs"]
mod replay_scenarios;
#[path = "../../../dynamic/tests/support/taped.rs"]
mod taped;

use kiln::dynamic::LazyTensor;
use kiln_models::dynamic::DynamicMlp;
use kiln_tensor::{Backend, RawTensor, Result};
use kiln_train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use replay_scenarios::{both, wave};

/// Trains the dynamic MLP (12 → 16 → 16 → 3) for ten steps of `batch` rows, a new
/// batch tensor each step; returns the losses and the first layer's weights.
fn trained<B: Backend, O: Optimizer<B>>(
    dev: &B::Device,
    batch: usize,
    mut opt: O,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut model = DynamicMlp::<B>::new(12, 16, 3, dev, 3)?;
    let mut losses = Vec::new();
    for s in 0..10 {
        let x = RawTensor::<B>::from_vec(wave(batch * 12, s), &[batch, 12], dev)?;
        let labels = (0..batch as i32).map(|i| (i + s as i32) % 3).collect();
        let y = RawTensor::<B>::from_vec::<i32>(labels, &[batch], dev)?;
        let (x, y) = (LazyTensor::from_raw(x), LazyTensor::from_raw(y));
        let loss = model.loss(&x, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_vec::<f32>()?[0]);
        opt.step(&mut model, &grads)?;
    }
    let weight = model
        .fc1()
        .param("weight")
        .expect("a linear layer's weight");
    Ok((losses, weight.value().to_vec()?))
}

fn mlp_training_replays<B: Backend>(dev: &B::Device) {
    let sgd = || {
        Sgd::<B>::new(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..SgdConfig::default()
        })
        .unwrap()
    };
    let adamw = || {
        AdamW::<B>::new(AdamWConfig {
            lr: 0.01,
            ..AdamWConfig::default()
        })
        .unwrap()
    };
    for batch in [8, 5] {
        let (replayed, plain, captures, replays) =
            both::<B, _>(|| trained::<B, _>(dev, batch, sgd()).unwrap());
        assert_eq!(replayed, plain, "SGD, batch {batch}");
        assert!(replayed.0[9] < replayed.0[0], "it trains: {:?}", replayed.0);
        assert!(
            captures >= 1 && replays >= 7,
            "{captures} captures, {replays} replays"
        );
        let (replayed, plain, captures, replays) =
            both::<B, _>(|| trained::<B, _>(dev, batch, adamw()).unwrap());
        assert_eq!(replayed, plain, "AdamW, batch {batch}");
        assert!(
            captures >= 1 && replays >= 7,
            "{captures} captures, {replays} replays"
        );
    }
}

/// One test: the replay switch is the process's, and each scenario turns it off for
/// its plain run.
#[test]
fn replayed_training_equals_plain_training() {
    mlp_training_replays::<taped::Taped>(&kiln_cpu::CpuDevice);
    #[cfg(feature = "cuda")]
    {
        use kiln_cubecl::{Cuda, CudaDevice};
        let dev = CudaDevice::first().unwrap_or_else(|e| panic!("no CUDA device: {e}"));
        replay_scenarios::all::<Cuda>(&dev);
        mlp_training_replays::<Cuda>(&dev);
    }
}
