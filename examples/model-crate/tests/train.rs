//! `Tabular` learns a rule of its features (the class is which of three feature sums
//! is largest) from seeded random rows in a short run, through the generated
//! `loss_and_grad`, an optimizer and a checkpoint round trip.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Module;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln_example_model::Tabular;

const BATCH: usize = 64;

fn batch(
    seed: u64,
) -> (
    Tensor<Cpu, Rank2<BATCH, 8>>,
    Tensor<Cpu, (Const<BATCH>,), i32>,
) {
    let x = Tensor::<Cpu, Rank2<BATCH, 8>>::normal(0.0, 1.0, seed, &CpuDevice).unwrap();
    let v = x.raw().to_vec::<f32>().unwrap();
    let labels = v
        .chunks(8)
        .map(|r| {
            let sums = [r[0] + r[1], r[2] + r[3] + r[4], r[5] + r[6] + r[7]];
            (0..3).max_by(|&a, &b| sums[a].total_cmp(&sums[b])).unwrap() as i32
        })
        .collect();
    (x, Tensor::from_vec(labels, &[BATCH], &CpuDevice).unwrap())
}

#[test]
fn tabular_learns_its_rule() {
    let mut model = Tabular::<Cpu>::init(&CpuDevice, 1).unwrap();
    let mut opt = AdamW::<Cpu>::new(AdamWConfig {
        lr: 3e-3,
        ..AdamWConfig::default()
    })
    .unwrap();
    let (test_x, test_y) = batch(10_000);
    let loss = |m: &Tabular<Cpu>| {
        m.loss(&test_x, &test_y)
            .unwrap()
            .raw()
            .to_vec::<f32>()
            .unwrap()[0]
    };
    let before = loss(&model);
    for step in 0..150 {
        let (x, y) = batch(step);
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
    }
    let after = loss(&model);
    assert!(
        after < before / 2.0,
        "held-out loss went from {before} to {after}"
    );

    let mut names = Vec::new();
    model.visit_params("", &mut |s| names.push(s.name.to_string()));
    assert!(names.iter().any(|n| n == "blocks.2.up.weight"), "{names:?}");

    let path =
        std::env::temp_dir().join(format!("kiln-example-{}.safetensors", std::process::id()));
    kiln::train::checkpoint::save(&model, &path).unwrap();
    let mut again = Tabular::<Cpu>::init(&CpuDevice, 7).unwrap();
    kiln::train::checkpoint::load(&mut again, &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loss(&again), after);
}
