//! `#[model(precision = int8)]`: an int8 instance holds the int8 form of each linear
//! layer and embedding (`LinearInt8`, `EmbeddingInt8`) and runs their products as
//! `matmul_int8`; it loads what `kiln-quantize` writes from the f32 model's
//! checkpoint, gives the logits of the CPU's int8 products chained by hand bit for bit,
//! the f32 model's to within the quantisation, the same values planned and op by op,
//! refuses an f32 checkpoint by name, and refuses to train.

use kiln::cpu::quant::linear;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::UnaryOp;
use kiln::train::checkpoint::int8::{quantize_int8, read_int8};
use kiln::train::checkpoint::{load, save};
use kiln::train::learner::Supervised;
use kiln_models::gpt::Gpt;
use kiln_models::mlp::{Mlp, MlpInt8};
use std::path::{Path, PathBuf};

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
fn the_int8_mlp_is_the_int8_products_chained_bit_for_bit_planned_and_op_by_op() {
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
    // The same products, bias and ReLUs chained by hand on the checkpoint's matrices.
    let c = read_int8(&file).unwrap();
    let mut h: Vec<f32> = x.to_vec().unwrap();
    for (i, layer) in ["fc1", "fc2", "fc3"].iter().enumerate() {
        let w = c.weight(&format!("{layer}.weight")).unwrap();
        let b = c.values(&format!("{layer}.bias")).unwrap();
        let act = (i < 2).then_some(UnaryOp::Relu);
        let mut y = vec![0.0; 16 * w.rows()];
        linear(&h, 16, w, Some(b), act, &mut y).unwrap();
        h = y;
    }
    assert_eq!(planned, h);
    let want = f32_model.forward(&x).unwrap().to_vec().unwrap();
    let spread = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(max_diff(&planned, &want) <= 0.02 * spread);
    // Its layers hold int8 weights and nothing it holds trains.
    let mut held = Vec::new();
    int8.visit_buffers("", &mut |s| {
        held.push((s.name.to_string(), s.value.dtype()))
    });
    assert_eq!(
        held[..3],
        [
            ("fc1.weight".to_string(), DType::I8),
            ("fc1.bias".to_string(), DType::F32),
            ("fc1.weight_scale".to_string(), DType::F32),
        ]
    );
    assert_eq!(int8.num_params(), 0);
    let labels = Tensor::<Cpu, Rank1<16>, i32>::from_vec(vec![3; 16], &[16], &CpuDevice).unwrap();
    let loss = int8
        .eval_loss(x.raw(), labels.raw())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(loss[0].is_finite());
    let e = int8
        .loss_and_grads(x.raw(), labels.raw())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("`MlpInt8` is an int8 instance, for inference"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_int8_gpt_follows_the_f32_one_planned_and_op_by_op() {
    let dir = scratch("gpt");
    let f32_model = TinyGpt::<Cpu>::init(&CpuDevice, 5).unwrap();
    let file = quantized(&f32_model, &dir);
    let mut int8 = TinyGptInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
    load(&mut int8, &file).unwrap();
    let ids: Vec<i32> = (0..2 * 32).map(|i| i * 37 % 256).collect();
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
