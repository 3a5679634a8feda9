//! `#[model(precision = int8)]`: an int8 instance holds the int8 form of each linear
//! layer and embedding (`LinearInt8`, `EmbeddingInt8`) and runs their products as
//! `matmul_int8`; it loads what `kiln-quantize` writes from the f32 model's
//! checkpoint, gives the hand-written int8 MLP's logits bit for bit, the f32 model's
//! to within the quantisation, the same values planned and op by op, and refuses an
//! f32 checkpoint by name.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::checkpoint::{int8::quantize_int8, load, save};
use kiln_models::gpt::Gpt;
use kiln_models::mlp::Mlp;
use kiln_models::mlp_int8::MlpInt8 as HandWrittenMlpInt8;
use std::path::{Path, PathBuf};

/// W1's MLP with int8 weights.
#[model(precision = int8)]
type MlpInt8 = Mlp;

#[model]
type TinyGpt = Gpt<16, 2, 2, 32>;
/// The tiny GPT with int8 weights (its blocks' layers, embeddings and head).
#[model(precision = int8)]
type TinyGptInt8 = Gpt<16, 2, 2, 32>;

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-int8-inst-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The int8 checkpoint of `model`, as `kiln-quantize` writes it.
fn quantized(model: &impl Module<Cpu>, dir: &Path) -> PathBuf {
    let (f32_file, int8_file) = (dir.join("f32.safetensors"), dir.join("int8.safetensors"));
    save(model, &f32_file).unwrap();
    quantize_int8(&f32_file, &int8_file).unwrap();
    int8_file
}

/// Largest |a - b| over two runs' values.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn the_int8_mlp_is_the_hand_written_one_bit_for_bit_planned_and_op_by_op() {
    let dir = scratch("mlp");
    let f32_model = Mlp::<Cpu>::init(&CpuDevice, 3).unwrap();
    let file = quantized(&f32_model, &dir);
    let mut int8 = MlpInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
    load(&mut int8, &file).unwrap();
    let x = Tensor::<Cpu, Rank2<16, 784>>::normal(0.0, 1.0, 4, &CpuDevice).unwrap();
    let planned = int8.forward(&x).unwrap().to_vec().unwrap();
    int8.set_fused(false);
    let op_by_op = int8.forward(&x).unwrap().to_vec().unwrap();
    assert_eq!(planned, op_by_op);
    let hand = HandWrittenMlpInt8::load(&file).unwrap();
    assert_eq!(planned, hand.logits(&x.to_vec().unwrap(), 16).unwrap());
    let want = f32_model.forward(&x).unwrap().to_vec().unwrap();
    let spread = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(max_diff(&planned, &want) <= 0.02 * spread);
    // Its layers hold int8 weights and nothing it holds trains.
    assert_eq!(int8.fc1.weight.raw().dtype(), DType::I8);
    assert_eq!(int8.num_params(), 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_int8_gpt_follows_the_f32_one_planned_and_op_by_op() {
    let dir = scratch("gpt");
    let f32_model = TinyGpt::<Cpu>::init(&CpuDevice, 5).unwrap();
    let file = quantized(&f32_model, &dir);
    let mut int8 = TinyGptInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
    load(&mut int8, &file).unwrap();
    let ids: Vec<i32> = (0..2 * 32).map(|i| (i * 37 % 256) as i32).collect();
    let ids = Tensor::<Cpu, Rank2<2, 32>, i32>::from_vec(ids, &[2, 32], &CpuDevice).unwrap();
    let planned = int8.logits(&ids).unwrap().to_vec().unwrap();
    int8.set_fused(false);
    let op_by_op = int8.logits(&ids).unwrap().to_vec().unwrap();
    assert!(
        max_diff(&planned, &op_by_op) <= 1e-4,
        "planned and op by op differ"
    );
    let want = f32_model.logits(&ids).unwrap().to_vec().unwrap();
    let spread = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = max_diff(&planned, &want);
    assert!(
        diff > 0.0 && diff <= 0.05 * spread,
        "int8 logits {diff} from the f32 model's (spread {spread})"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_int8_instance_refuses_an_f32_checkpoint_by_name() {
    let dir = scratch("refuse");
    let f32_model = Mlp::<Cpu>::init(&CpuDevice, 3).unwrap();
    let f32_file = dir.join("f32.safetensors");
    save(&f32_model, &f32_file).unwrap();
    let mut int8 = MlpInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
    let e = load(&mut int8, &f32_file).unwrap_err().to_string();
    assert!(
        e.contains("fc1.weight") && e.contains("i8") && e.contains("fc1.weight_scale"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
