//! The imported decoder as this crate ships it: the embedded weights give PyTorch's
//! outputs, and fine-tuning through `NextToken` learns a toy next-token rule, its
//! checkpoint saved and loaded back into the bare `Decoder`.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::checkpoint;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln_example_imported::{shipped, Decoder, NextToken, CHECKPOINT};
use kiln_import::{read_tensor, TensorData};

type Tokens = Tensor<Cpu, (Const<2>, Const<8>), i32>;

fn model_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("model")
        .join(name)
}

#[test]
fn the_embedded_decoder_gives_pytorchs_outputs() {
    let ids = match read_tensor(model_file("input_0.pb")).unwrap().data {
        TensorData::I64(v) => v.iter().map(|&i| i as i32).collect(),
        other => panic!("token ids held as {other:?}"),
    };
    let want = match read_tensor(model_file("output_0.pb")).unwrap().data {
        TensorData::F32(v) => v,
        other => panic!("logits held as {other:?}"),
    };
    let model = shipped::<Cpu>(&CpuDevice).unwrap();
    let got = model
        .forward(&Tokens::from_vec(ids, &[2, 8], &CpuDevice).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "logit {i}: {a} against PyTorch's {b}"
        );
    }
}

#[test]
fn fine_tuning_learns_and_ships() {
    // Each token's successor is the next one mod 20.
    let tokens: Vec<i32> = (0..16).map(|i| i * 7 % 20).collect();
    let next: Vec<i32> = tokens.iter().map(|t| (t + 1) % 20).collect();
    let x = Tokens::from_vec(tokens, &[2, 8], &CpuDevice).unwrap();
    let y = Tensor::<Cpu, (Dyn,), i32>::from_vec(next, &[16], &CpuDevice).unwrap();
    let mut model = NextToken::<Cpu>::init(&CpuDevice, 0).unwrap();
    checkpoint::load(&mut model.net, CHECKPOINT).expect("the imported weights load");
    let loss = |m: &NextToken<Cpu>| m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0];
    let first = loss(&model);
    let mut opt = AdamW::<Cpu>::new(AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    })
    .unwrap();
    for _ in 0..40 {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
    }
    let last = loss(&model);
    assert!(
        last < first / 4.0,
        "fine-tuning took the loss from {first} to {last}"
    );

    // Saved as the bare decoder's checkpoint, it loads back into `Decoder`.
    let dir = std::env::temp_dir().join(format!("kiln-imported-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tuned.safetensors");
    checkpoint::save(&model.net, &file).unwrap();
    let mut shipped = Decoder::<Cpu>::init(&CpuDevice, 1).unwrap();
    checkpoint::load(&mut shipped, &file).unwrap();
    assert_eq!(
        shipped.forward(&x).unwrap().to_vec().unwrap(),
        model.net.forward(&x).unwrap().to_vec().unwrap()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_model_whose_names_are_hostile_imports_as_the_same_model() {
    // The struct's name is the hostile file stem's letters and digits.
    type Hostile = kiln_example_imported::hostile::HostilexPubFnInjectedPubFnAlso2J<Cpu>;
    let ids: Vec<i32> = (0..16).map(|i| (i * 7) % 20).collect();
    let tokens = Tokens::from_vec(ids, &[2, 8], &CpuDevice).unwrap();
    let plain = shipped::<Cpu>(&CpuDevice).unwrap();
    let mut hostile = Hostile::init(&CpuDevice, 1).unwrap();
    checkpoint::load(&mut hostile, CHECKPOINT).unwrap();
    assert_eq!(
        hostile.forward(&tokens).unwrap().to_vec().unwrap(),
        plain.forward(&tokens).unwrap().to_vec().unwrap()
    );
}
