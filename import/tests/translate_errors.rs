//! What kiln-import cannot translate yet is one error naming each op with its nodes
//! and the opset; uses of a translated op it cannot express say why; the command line
//! refuses nonsense in one line.

use kiln_import::onnx;
use kiln_import::{decode, read, translate, ImportError};
use prost::Message;
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn untranslated_ops_are_one_error_naming_each() {
    let cnn = read(fixture("cnn.onnx")).unwrap();
    let e = translate(&cnn, "Cnn", "cnn.onnx").expect_err("convolutions are not translated yet");
    assert!(
        matches!(e, ImportError::Unsupported(ref nodes, 17) if nodes.len() == 5),
        "{e}"
    );
    let text = e.to_string();
    for wanted in [
        "cannot translate 5 nodes at opset 17",
        "Conv (`/conv1/Conv`, `/conv2/Conv`)",
        "BatchNormalization (`/bn1/BatchNormalization`)",
        "MaxPool",
        "GlobalAveragePool",
    ] {
        assert!(text.contains(wanted), "wanted `{wanted}` in: {text}");
    }
    // A big graph's error stays readable: each op once, three nodes named.
    let decoder = read(fixture("decoder.onnx")).unwrap();
    let text = translate(&decoder, "Decoder", "decoder.onnx")
        .unwrap_err()
        .to_string();
    assert_eq!(text.matches("Constant (").count(), 1, "{text}");
    assert!(text.contains("more"), "{text}");
    assert!(text.len() < 4000, "{} characters", text.len());
}

#[test]
fn a_use_of_a_translated_op_that_cannot_be_expressed_says_why() {
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    let gemm = &mut m.graph.as_mut().unwrap().node[0];
    gemm.attribute.retain(|a| a.name() != "alpha");
    gemm.attribute.push(onnx::AttributeProto {
        name: Some("alpha".into()),
        r#type: Some(onnx::attribute_proto::AttributeType::Float as i32),
        f: Some(2.0),
        ..Default::default()
    });
    let g = decode(&m.encode_to_vec()).unwrap();
    let e = translate(&g, "Mlp", "mlp.onnx").unwrap_err().to_string();
    assert!(
        e.contains("Gemm (`/fc1/Gemm`: a Gemm with alpha or beta other than 1)"),
        "{e}"
    );
}

#[test]
fn the_command_line_refuses_nonsense_in_one_line() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln-import"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mlp = fixture("mlp.onnx");
    let mlp = mlp.to_str().unwrap();
    let (code, err) = run(&["--bogus"]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("error: unknown flag `--bogus`"), "{err}");
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("error: no model named"), "{err}");
    let (code, err) = run(&[mlp, "--name"]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("error: --name needs a value"), "{err}");
    let (code, err) = run(&[mlp, "--name", "not a name", "--out-dir", "/tmp"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("`not a name` is not a model name"), "{err}");
    let (code, err) = run(&["/nonexistent/model.onnx"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot read `/nonexistent/model.onnx`"),
        "{err}"
    );
    let (code, err) = run(&[mlp, "--out-dir", "/nonexistent/folder"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("/nonexistent/folder/mlp.rs"), "{err}");
}
