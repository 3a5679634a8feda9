//! A short MNIST run of the `#[model]` MLP through the whole training stack (data
//! loader, build-time gradients, SGD, schedule, checkpoint round trip):
//! `kiln_models::classify::short_mnist_run`, the recipe every backend's suite runs, must
//! reach 95% test accuracy after one pass over 20,000 examples.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::checkpoint;
use kiln_models::classify::{accuracy, short_mnist_run};
use kiln_models::data::ImageDataset;
use kiln_models::mlp::Mlp;

#[test]
fn mlp_reaches_95_percent_after_a_short_run() -> Result<()> {
    let dev = CpuDevice;
    let run = short_mnist_run::<Cpu>(&dev)?;
    run.learned()
        .unwrap_or_else(|e| panic!("the short run did not learn: {e}"));

    // The checkpoint brings back exactly this model.
    let data = ImageDataset::mnist()?;
    let dir = std::env::temp_dir().join(format!("kiln-mnist-short-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("mlp.safetensors");
    checkpoint::save(&run.model, &path)?;
    let mut again = Mlp::<Cpu>::init(&dev, 99)?;
    checkpoint::load(&mut again, &path)?;
    assert_eq!(
        accuracy(&again, std::sync::Arc::new(data.test), &dev)?,
        run.accuracy
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
