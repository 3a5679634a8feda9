//! PyTorch's models imported end to end. For each fixture the source kiln-import
//! writes is the committed one in `expected/`, which this test compiles (`include!`),
//! loads with the checkpoint kiln-import writes, and runs on the fixture's input:
//! PyTorch's output to within 1e-5, planned and op by op. The MLP's layers are `Gemm`s;
//! `mlp_matmul`'s are `MatMul` then `Add`, with tanh and sigmoid; the CNN's are
//! convolutions, a batch norm with its running statistics, max and global average
//! pooling and a flatten; the attention block's are an embedding, layer norms, heads
//! split by reshapes whose sizes fold from the graph's shape subgraphs, products of
//! activations, a softmax and an exact GELU written out; the causal decoder adds
//! learned positions, q, k and v sliced from one projection and PyTorch's causal mask;
//! the encoder is PyTorch's own `nn.TransformerEncoder`; `ops` holds a tanh GELU,
//! average pooling, means, powers and log-softmax. The same models exported at other
//! opsets translate to the same source. The imported MLP is fine-tuned as a part of a
//! model with a loss: its gradients match finite differences and training lowers the
//! loss; the decoder's gradients match too. The MLP's checkpoint is the committed one byte for byte,
//! and `kiln::embed!` builds it in, checked against the model at build time. A caller's
//! wrong input shape against an imported model is a ui case (`ui-tests`,
//! `imported_model_wrong_input`).

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Module;
use kiln::tensor::{Rank2, RawTensor, Tensor as Typed};
use kiln::train::checkpoint;
use kiln_import::{read, read_tensor, translate, TensorData};
use std::path::PathBuf;

mod mlp {
    include!("expected/mlp.rs");
}
mod mlp_matmul {
    include!("expected/mlp_matmul.rs");
}
mod cnn {
    include!("expected/cnn.rs");
}
mod attention {
    include!("expected/attention.rs");
}
mod decoder {
    include!("expected/decoder.rs");
}
mod encoder {
    include!("expected/encoder.rs");
}
mod ops {
    include!("expected/ops.rs");
}

/// The imported MLP fine-tuned for a 4-class task: a model holding it, with a loss.
#[model]
pub struct Tuned {
    net: mlp::Mlp,
}

#[model]
impl Tuned {
    pub fn loss<const B: usize>(&self, x: Tensor<B, 20>, y: Tensor<B, i32>) -> Tensor {
        self.net.forward(x).cross_entropy(y)
    }
}

/// The imported decoder fine-tuned on next tokens: a model holding it, with a loss.
#[model]
pub struct TunedDecoder {
    net: decoder::Decoder,
}

#[model]
impl TunedDecoder {
    pub fn loss<const B: usize, const T: usize>(
        &self,
        x: Tensor<B, T, i32>,
        y: Tensor<Dyn, i32>,
    ) -> Tensor {
        self.net.forward(x).reshape::<Dyn, 20>().cross_entropy(y)
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn floats(path: &str) -> Vec<f32> {
    match read_tensor(fixture(path))
        .expect("the fixture's tensor")
        .data
    {
        TensorData::F32(v) => v,
        other => panic!("{path} holds {other:?}"),
    }
}

/// `got` within 1e-5 of PyTorch's output of `stem`.
fn assert_pytorchs(stem: &str, got: &[f32], fused: bool) {
    let want = floats(&format!("{stem}/output_0.pb"));
    assert_eq!(got.len(), want.len(), "{stem}");
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "{stem} output {i}: {a} (fused: {fused}) against PyTorch's {b}"
        );
    }
}

/// Imports fixture `$stem` into a fresh folder and loads the checkpoint written
/// there into a new `$model`: the model, and the folder to remove.
macro_rules! imported {
    ($stem:literal, $model:ty) => {{
        let dir = out_dir($stem);
        let done =
            kiln_import::import(fixture(concat!($stem, ".onnx")), &dir, None).expect("the import");
        let mut model = <$model>::init(&CpuDevice, 0).unwrap();
        checkpoint::load(&mut model, &done.checkpoint).expect("the checkpoint loads");
        (model, dir)
    }};
}

/// `$model.forward($x)` gives PyTorch's output of fixture `$stem`, planned and op by op.
macro_rules! gives_pytorchs {
    ($stem:literal, $model:expr, $x:expr) => {
        for fused in [true, false] {
            $model.set_fused(fused);
            assert_pytorchs($stem, &$model.forward($x).unwrap().to_vec().unwrap(), fused);
        }
    };
}

/// A fresh folder for one import.
fn out_dir(stem: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-import-{stem}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_sources_written_are_the_committed_ones() {
    for (stem, name, expected, tensors) in [
        ("mlp", "Mlp", include_str!("expected/mlp.rs"), 6),
        (
            "mlp_matmul",
            "MlpMatmul",
            include_str!("expected/mlp_matmul.rs"),
            4,
        ),
        ("cnn", "Cnn", include_str!("expected/cnn.rs"), 10),
        (
            "attention",
            "Attention",
            include_str!("expected/attention.rs"),
            19,
        ),
        (
            "decoder",
            "Decoder",
            include_str!("expected/decoder.rs"),
            30,
        ),
        (
            "encoder",
            "Encoder",
            include_str!("expected/encoder.rs"),
            27,
        ),
    ] {
        let graph = read(fixture(&format!("{stem}.onnx"))).expect("the fixture reads");
        let t = translate(&graph, name, &format!("{stem}.onnx")).expect("it translates");
        assert_eq!(
            t.source, expected,
            "kiln-import's source for {stem} changed: if on purpose, `cargo run -p \
             kiln-import -- import/tests/fixtures/{stem}.onnx --out-dir import/tests/expected`"
        );
        assert_eq!(t.tensors.len(), tensors, "{stem}");
    }
}

#[test]
fn the_same_model_exported_otherwise_translates_alike() {
    // The decoder exported without constant folding: its weights' transposes are
    // nodes of the graph, folded at import time into the same tensors.
    let file = "decoder.onnx";
    let folded = translate(&read(fixture(file)).unwrap(), "Decoder", file).unwrap();
    let unfolded = read(fixture("decoder_unfolded.onnx")).unwrap();
    assert!(unfolded.nodes.len() > read(fixture(file)).unwrap().nodes.len());
    assert_eq!(translate(&unfolded, "Decoder", file).unwrap(), folded);
}

#[test]
fn the_oldest_and_newest_opsets_translate_alike() {
    // PyTorch's models exported at other opsets in 13..=21 (the range Kiln imports)
    // are the opset 17 ones: the same source but for its header, the same tensors.
    // At opset 13 the attention block's layer norms are written out (ReduceMean, Sub,
    // Pow, Sqrt, Div, Mul, Add); at 21 the decoder's GELU is a `Gelu` op.
    for (stem, name, opsets) in [
        ("mlp", "Mlp", &[13, 21][..]),
        ("attention", "Attention", &[13]),
        ("decoder", "Decoder", &[14, 21]),
    ] {
        let file = format!("{stem}.onnx");
        let at17 = translate(&read(fixture(&file)).unwrap(), name, &file).unwrap();
        for &opset in opsets {
            let graph = read(fixture(&format!("{stem}_opset{opset}.onnx"))).unwrap();
            assert_eq!(graph.opset, opset);
            let t = translate(&graph, name, &file).unwrap();
            assert_eq!(
                t.source,
                at17.source
                    .replace("ONNX opset 17", &format!("ONNX opset {opset}")),
                "{stem} at opset {opset}"
            );
            assert_eq!(t.tensors, at17.tensors, "{stem} at opset {opset}");
        }
    }
}

#[test]
fn the_imported_mlp_gives_pytorchs_outputs_planned_and_op_by_op() {
    let (model, dir) = imported!("mlp", mlp::Mlp<Cpu>);
    let x = Typed::<Cpu, Rank2<3, 20>>::from_vec(floats("mlp/input_0.pb"), &[3, 20], &CpuDevice)
        .unwrap();
    gives_pytorchs!("mlp", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn matmul_layers_give_pytorchs_outputs_planned_and_op_by_op() {
    let (model, dir) = imported!("mlp_matmul", mlp_matmul::MlpMatmul<Cpu>);
    let x =
        Typed::<Cpu, Rank2<2, 12>>::from_vec(floats("mlp_matmul/input_0.pb"), &[2, 12], &CpuDevice)
            .unwrap();
    gives_pytorchs!("mlp_matmul", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_imported_checkpoint_is_checked_and_built_in_by_embed() {
    // `expected/mlp.safetensors` is kiln-import's checkpoint of the MLP, byte for byte.
    let dir = out_dir("mlp-embed");
    let done = kiln_import::import(fixture("mlp.onnx"), &dir, None).expect("the import");
    assert_eq!(done.name, "Mlp", "named after the file's stem");
    assert_eq!(
        std::fs::read(&done.checkpoint).unwrap(),
        include_bytes!("expected/mlp.safetensors"),
        "kiln-import's checkpoint changed: if on purpose, `cargo run -p kiln-import -- \
         import/tests/fixtures/mlp.onnx --out-dir import/tests/expected`"
    );
    // Checked against the model when this test compiled, checksums verified on load.
    let model = kiln::embed!(mlp::Mlp, "expected/mlp.safetensors")
        .load::<Cpu>(&CpuDevice)
        .unwrap();
    let x = Typed::<Cpu, Rank2<3, 20>>::from_vec(floats("mlp/input_0.pb"), &[3, 20], &CpuDevice)
        .unwrap();
    assert_pytorchs("mlp", &model.forward(&x).unwrap().to_vec().unwrap(), true);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_imported_cnn_gives_pytorchs_outputs_planned_and_op_by_op() {
    let (model, dir) = imported!("cnn", cnn::Cnn<Cpu>);
    // `forward` is inference: batch norm normalises with the running statistics
    // PyTorch exported (training would use the batch's).
    let x = Typed::<Cpu, kiln::tensor::Rank4<2, 1, 8, 8>>::from_vec(
        floats("cnn/input_0.pb"),
        &[2, 1, 8, 8],
        &CpuDevice,
    )
    .unwrap();
    gives_pytorchs!("cnn", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_imported_attention_block_gives_pytorchs_outputs_planned_and_op_by_op() {
    let (model, dir) = imported!("attention", attention::Attention<Cpu>);
    // PyTorch's int64 token ids as Kiln's i32.
    let x = token_ids::<2, 6>("attention");
    gives_pytorchs!("attention", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

/// The token ids of fixture `stem`'s input: PyTorch's int64 as Kiln's i32.
fn token_ids<const B: usize, const T: usize>(
    stem: &str,
) -> Typed<Cpu, (kiln::tensor::Const<B>, kiln::tensor::Const<T>), i32> {
    let ids: Vec<i32> = match read_tensor(fixture(&format!("{stem}/input_0.pb")))
        .unwrap()
        .data
    {
        TensorData::I64(v) => v.iter().map(|&i| i as i32).collect(),
        other => panic!("token ids held as {other:?}"),
    };
    Typed::from_vec(ids, &[B, T], &CpuDevice).unwrap()
}

#[test]
fn pooling_means_powers_and_log_softmax_give_pytorchs_outputs_planned_and_op_by_op() {
    // Opset 21's `Gelu` op (tanh), `AveragePool`, `ReduceMean` with and without
    // keepdims (axes as an input), `Pow` by 2, `Sqrt` of a computed value, `LogSoftmax`.
    let (model, dir) = imported!("ops", ops::Ops<Cpu>);
    let x = Typed::<Cpu, kiln::tensor::Rank4<2, 1, 8, 8>>::from_vec(
        floats("ops/input_0.pb"),
        &[2, 1, 8, 8],
        &CpuDevice,
    )
    .unwrap();
    gives_pytorchs!("ops", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_imported_causal_decoder_gives_pytorchs_outputs_planned_and_op_by_op() {
    // Learned positions (`Range` into a table: `.positions()`), q, k and v cut from
    // one layer's output (`Slice`: `.narrow()`), the mask PyTorch builds from
    // `Trilu` and `Where` (`.causal_mask()`), two pre-norm blocks.
    let (model, dir) = imported!("decoder", decoder::Decoder<Cpu>);
    let x = token_ids::<2, 8>("decoder");
    gives_pytorchs!("decoder", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_imported_transformer_encoder_gives_pytorchs_outputs_planned_and_op_by_op() {
    // PyTorch's own nn.TransformerEncoder: nn.MultiheadAttention's packed projection
    // split by `Unsqueeze`, `Squeeze` and `Gather` of computed values.
    let (model, dir) = imported!("encoder", encoder::Encoder<Cpu>);
    let x = token_ids::<2, 8>("encoder");
    gives_pytorchs!("encoder", model, &x);
    std::fs::remove_dir_all(&dir).ok();
}

/// Moves element `index` of the parameter `name` by `delta`, the way optimizers do.
fn nudge<M: Module<Cpu>>(model: &mut M, grads: &M::Grads, name: &str, index: usize, delta: f32) {
    let mut f = |n: &str, p: &mut RawTensor<Cpu>, _g: &RawTensor<Cpu>| -> kiln::Result<()> {
        if n == name {
            let mut v = p.to_vec::<f32>()?;
            v[index] += delta;
            *p = RawTensor::from_vec(v, p.dims().as_slice(), p.device())?;
        }
        Ok(())
    };
    model.update_params(grads, "", &mut f).unwrap();
}

#[test]
fn the_imported_mlp_fine_tunes_with_gradients_matching_finite_differences() {
    use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
    let dir = out_dir("mlp-tuned");
    let done = kiln_import::import(fixture("mlp.onnx"), &dir, None).expect("the import");
    let mut model = Tuned::<Cpu>::init(&CpuDevice, 0).unwrap();
    checkpoint::load(&mut model.net, &done.checkpoint).expect("the imported weights load");
    let x = Typed::<Cpu, Rank2<8, 20>>::normal(0.0, 1.0, 5, &CpuDevice).unwrap();
    let y = Typed::<Cpu, (kiln::tensor::Const<8>,), i32>::from_vec(
        (0..8).map(|i| i % 4).collect(),
        &[8],
        &CpuDevice,
    )
    .unwrap();
    let loss = |m: &Tuned<Cpu>| m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0];
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    let mut analytic = std::collections::HashMap::new();
    model
        .update_params(&grads, "", &mut |n, _p, g| {
            analytic.insert(n.to_string(), g.to_vec::<f32>()?);
            Ok(())
        })
        .unwrap();
    let eps = 1e-2;
    for (name, index) in [
        ("net.fc1.weight", 37),
        ("net.fc2.bias", 3),
        ("net.fc3.weight", 10),
    ] {
        nudge(&mut model, &grads, name, index, eps);
        let up = loss(&model);
        nudge(&mut model, &grads, name, index, -2.0 * eps);
        let down = loss(&model);
        nudge(&mut model, &grads, name, index, eps);
        let numeric = (up - down) / (2.0 * eps);
        let got = analytic[name][index];
        assert!(
            numeric.abs() > 1e-4 && (got - numeric).abs() <= 5e-5 + 0.02 * numeric.abs(),
            "{name}[{index}]: gradient {got}, finite difference {numeric}"
        );
    }
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.3,
        ..SgdConfig::default()
    })
    .unwrap();
    let first = loss(&model);
    for _ in 0..60 {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
    }
    let last = loss(&model);
    assert!(
        last < first / 2.0,
        "fine-tuning took the loss from {first} to {last}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_imported_decoder_has_gradients_matching_finite_differences() {
    // Through the positions, the slices of q, k and v and the causal mask.
    let dir = out_dir("decoder-tuned");
    let done = kiln_import::import(fixture("decoder.onnx"), &dir, None).expect("the import");
    let mut model = TunedDecoder::<Cpu>::init(&CpuDevice, 0).unwrap();
    checkpoint::load(&mut model.net, &done.checkpoint).expect("the imported weights load");
    let x = token_ids::<2, 8>("decoder");
    let next: Vec<i32> = x
        .raw()
        .to_vec::<i32>()
        .unwrap()
        .iter()
        .map(|t| (t + 1) % 20)
        .collect();
    let y = Typed::<Cpu, (Dyn,), i32>::from_vec(next, &[16], &CpuDevice).unwrap();
    let loss = |m: &TunedDecoder<Cpu>| m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0];
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    let mut analytic = std::collections::HashMap::new();
    model
        .update_params(&grads, "", &mut |n, _p, g| {
            analytic.insert(n.to_string(), g.to_vec::<f32>()?);
            Ok(())
        })
        .unwrap();
    let eps = 1e-2;
    // The query, key and value rows of each block's packed projection (rows 0..16,
    // 16..32 and 32..48 of its [48, 16] weight), the positions, a layer norm: in each,
    // the element of the largest gradient, which f32 differences resolve.
    let largest = |name: &str, range: std::ops::Range<usize>| {
        let g = &analytic[name];
        range
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .unwrap()
    };
    let mut checked = Vec::new();
    for block in ["net.qkv_0.weight", "net.qkv_1.weight"] {
        for rows in [0..16, 16..32, 32..48] {
            checked.push((block, largest(block, rows.start * 16..rows.end * 16)));
        }
    }
    checked.push(("net.pos.weight", largest("net.pos.weight", 0..8 * 16)));
    checked.push(("net.ln1_1.weight", largest("net.ln1_1.weight", 0..16)));
    for (name, index) in checked {
        nudge(&mut model, &grads, name, index, eps);
        let up = loss(&model);
        nudge(&mut model, &grads, name, index, -2.0 * eps);
        let down = loss(&model);
        nudge(&mut model, &grads, name, index, eps);
        let numeric = (up - down) / (2.0 * eps);
        let got = analytic[name][index];
        assert!(
            numeric.abs() > 1e-4 && (got - numeric).abs() <= 5e-5 + 0.03 * numeric.abs(),
            "{name}[{index}]: gradient {got}, finite difference {numeric}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
