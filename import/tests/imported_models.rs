//! PyTorch's models imported end to end. For each fixture the source kiln-import
//! writes is the committed one in `expected/`, which this test compiles (`include!`),
//! loads with the checkpoint kiln-import writes, and runs on the fixture's input:
//! PyTorch's output to within 1e-5, planned and op by op. The MLP's layers are `Gemm`s;
//! `mlp_matmul`'s are `MatMul` then `Add`, with tanh and sigmoid. A caller's wrong
//! input shape against an imported model is a ui case (`ui-tests`,
//! `imported_model_wrong_input`).

use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::{Rank2, Tensor as Typed};
use kiln::train::checkpoint;
use kiln_import::{read, read_tensor, translate, TensorData};
use std::path::PathBuf;

mod mlp {
    include!("expected/mlp.rs");
}
mod mlp_matmul {
    include!("expected/mlp_matmul.rs");
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
fn the_imported_mlp_gives_pytorchs_outputs_planned_and_op_by_op() {
    let dir = out_dir("mlp");
    let done = kiln_import::import(fixture("mlp.onnx"), &dir, None).expect("the import");
    assert_eq!(done.name, "Mlp");
    let mut model = mlp::Mlp::<Cpu>::init(&CpuDevice, 0).unwrap();
    checkpoint::load(&mut model, &done.checkpoint)
        .expect("the checkpoint loads, checksums and all");
    let x = Typed::<Cpu, Rank2<3, 20>>::from_vec(floats("mlp/input_0.pb"), &[3, 20], &CpuDevice)
        .unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        assert_pytorchs("mlp", &model.forward(&x).unwrap().to_vec().unwrap(), fused);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn matmul_layers_give_pytorchs_outputs_planned_and_op_by_op() {
    let dir = out_dir("mlp_matmul");
    let done = kiln_import::import(fixture("mlp_matmul.onnx"), &dir, None).expect("the import");
    let mut model = mlp_matmul::MlpMatmul::<Cpu>::init(&CpuDevice, 0).unwrap();
    checkpoint::load(&mut model, &done.checkpoint).expect("the checkpoint loads");
    let x =
        Typed::<Cpu, Rank2<2, 12>>::from_vec(floats("mlp_matmul/input_0.pb"), &[2, 12], &CpuDevice)
            .unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        assert_pytorchs(
            "mlp_matmul",
            &model.forward(&x).unwrap().to_vec().unwrap(),
            fused,
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
