//! Compatibility: a LeNet that PyTorch built and saved (`safetensors.torch.save_file`,
//! PyTorch's names, batch-norm counters and all), embedded into this test binary with
//! `kiln::embed!(.., foreign)` and checked against `LeNet` when it compiled, gives
//! PyTorch's logits to within 1e-5 on Fashion-MNIST test images, fused and op by op,
//! and so does the same file loaded at run time. The fixture and PyTorch's logits come
//! from scripts/make_torch_fixture.py; CI needs no PyTorch.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::train::checkpoint;
use kiln_models::classify::{images, Classifier};
use kiln_models::cli::ImageData;
use kiln_models::data::{Split, SplitName};
use kiln_models::lenet::LeNet;
use std::path::Path;

/// PyTorch's logits, one row per test image.
fn torch_logits() -> Vec<Vec<f32>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_lenet_logits.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// The largest difference between `model`'s logits and PyTorch's.
fn worst_difference(model: &LeNet<Cpu>, want: &[Vec<f32>]) -> f32 {
    let data = ImageData::Fashion;
    let dir = kiln_models::data::data_dir().join(data.folder());
    let test = Split::load(&dir, SplitName::Test, data.norm()).unwrap();
    let mut worst = 0.0f32;
    for (i, row) in want.iter().enumerate() {
        let x =
            images::<Cpu, LeNet<Cpu>>(test.images[i * 784..(i + 1) * 784].to_vec(), 1, &CpuDevice)
                .unwrap();
        let got = model.logits(&x).unwrap().to_vec::<f32>().unwrap();
        for (a, b) in got.iter().zip(row) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

#[test]
fn a_pytorch_checkpoint_gives_pytorchs_logits() {
    let want = torch_logits();
    assert_eq!(want.len(), 8);
    let model = kiln::embed!(LeNet, "fixtures/torch_lenet.safetensors", foreign)
        .load::<Cpu>(&CpuDevice)
        .unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        let worst = worst_difference(&model, &want);
        assert!(
            worst <= 1e-5,
            "fused {fused}: logits differ from PyTorch's by {worst}"
        );
    }
    // PyTorch's batch-norm counter became the model's step count.
    assert_eq!(model.step_seeds().taken(), 1234);

    // Loaded at run time: the same, and refused without the opt-out (no checksums).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_lenet.safetensors");
    let mut loaded = LeNet::<Cpu>::init(&CpuDevice, 9).unwrap();
    let e = checkpoint::load(&mut loaded, &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no tensor checksums"), "{e}");
    checkpoint::load_foreign(&mut loaded, &path).unwrap();
    assert!(worst_difference(&loaded, &want) <= 1e-5);
}
