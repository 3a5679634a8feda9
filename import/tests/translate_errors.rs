//! What kiln-import cannot translate is one error naming each op with its nodes and
//! the opset; uses of a translated op it cannot express say why (a scaled Gemm, a
//! dilated convolution, a batch norm of another ε, a padded pool, a mask that is not
//! causal, positions that are not 0..T, an Expand that enlarges); hostile attributes
//! and constants give a model or an error, never a panic; the command line refuses
//! nonsense in one line.

use kiln_import::onnx;
use kiln_import::{decode, read, translate};
use prost::Message;
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The fixture `stem` with `edit` applied to its nodes: the translation's error.
fn edited_error(stem: &str, edit: impl Fn(&mut Vec<onnx::NodeProto>)) -> String {
    let bytes = std::fs::read(fixture(&format!("{stem}.onnx"))).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    edit(&mut m.graph.as_mut().unwrap().node);
    let g = decode(&m.encode_to_vec()).unwrap();
    translate(&g, "Edited", "edited.onnx")
        .unwrap_err()
        .to_string()
}

#[test]
fn untranslated_ops_are_one_error_naming_each() {
    // The MLP with its ReLUs made SELUs and its last layer a Hardmax.
    let text = edited_error("mlp", |nodes| {
        for n in nodes.iter_mut() {
            match n.op_type() {
                "Relu" => n.op_type = Some("Selu".into()),
                "Gemm" if n.name() == "/fc3/Gemm" => n.op_type = Some("Hardmax".into()),
                _ => {}
            }
        }
    });
    for wanted in [
        "cannot translate 3 nodes at opset 17",
        "Selu (`/Relu`, `/Relu_1`)",
        "Hardmax (`/fc3/Gemm`)",
    ] {
        assert!(text.contains(wanted), "wanted `{wanted}` in: {text}");
    }
}

#[test]
fn a_mask_that_is_not_causal_says_why() {
    // The decoder's mask made the lower triangle: each query would see only the
    // keys after it, which `.causal_mask()` is not.
    let text = edited_error("decoder", |nodes| {
        let trilu = nodes.iter_mut().find(|n| n.op_type() == "Trilu").unwrap();
        for a in &mut trilu.attribute {
            if a.name() == "upper" {
                a.i = Some(0);
            }
        }
    });
    assert!(
        text.contains("Where (`/Where`: a Where that hides another triangle"),
        "{text}"
    );
    // The masked scores read by something other than a softmax: −∞ and Kiln's
    // finite mask would differ.
    let text = edited_error("decoder", |nodes| {
        let softmax = nodes.iter_mut().find(|n| n.op_type() == "Softmax").unwrap();
        softmax.op_type = Some("Exp".into());
        softmax.attribute.clear();
    });
    assert!(
        text.contains("a causal mask read by something other than a softmax over the last axis"),
        "{text}"
    );
    // Positions that are not 0..T.
    let text = edited_error("decoder", |nodes| {
        let range = nodes
            .iter()
            .find(|n| n.op_type() == "Range")
            .unwrap()
            .clone();
        // The Range's start made its step (1).
        let step = range.input[2].clone();
        let r = nodes.iter_mut().find(|n| n.op_type() == "Range").unwrap();
        r.input[0] = step;
    });
    assert!(
        text.contains("Range (`/Range`: a Range other than 0..n by 1"),
        "{text}"
    );
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

/// The CNN fixture with `edit` applied to its node of op `op`: the translation's error.
fn cnn_error(op: &str, edit: impl Fn(&mut onnx::NodeProto)) -> String {
    let bytes = std::fs::read(fixture("cnn.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    let node = m
        .graph
        .as_mut()
        .unwrap()
        .node
        .iter_mut()
        .find(|n| n.op_type() == op)
        .unwrap();
    edit(node);
    let g = decode(&m.encode_to_vec()).unwrap();
    translate(&g, "Cnn", "cnn.onnx").unwrap_err().to_string()
}

/// Sets attribute `name` of `node` to integers `v`.
fn set_ints(node: &mut onnx::NodeProto, name: &str, v: &[i64]) {
    node.attribute.retain(|a| a.name() != name);
    node.attribute.push(onnx::AttributeProto {
        name: Some(name.into()),
        r#type: Some(onnx::attribute_proto::AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    });
}

#[test]
fn convolution_and_pooling_uses_kiln_has_no_layer_for_say_why() {
    let e = cnn_error("Conv", |n| set_ints(n, "dilations", &[2, 2]));
    assert!(e.contains("Conv (`/conv1/Conv`: a dilated Conv)"), "{e}");
    let e = cnn_error("Conv", |n| set_ints(n, "pads", &[1, 0, 1, 0]));
    assert!(
        e.contains("`pads` [1, 0, 1, 0] (Kiln's layers take square windows"),
        "{e}"
    );
    let e = cnn_error("MaxPool", |n| set_ints(n, "pads", &[1, 1, 1, 1]));
    assert!(e.contains("MaxPool (`/MaxPool`: a padded MaxPool)"), "{e}");
    let e = cnn_error("BatchNormalization", |n| {
        n.attribute.retain(|a| a.name() != "epsilon");
        n.attribute.push(onnx::AttributeProto {
            name: Some("epsilon".into()),
            r#type: Some(onnx::attribute_proto::AttributeType::Float as i32),
            f: Some(1e-3),
            ..Default::default()
        });
    });
    assert!(
        e.contains("epsilon 0.0010000000474974513 (Kiln's batch norm uses 0.00001)"),
        "{e}"
    );
}

#[test]
fn a_layer_whose_weights_are_not_floats_says_so() {
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let bias = g
        .initializer
        .iter_mut()
        .find(|t| t.name() == "fc2.bias")
        .unwrap();
    bias.data_type = Some(onnx::tensor_proto::DataType::Int64 as i32);
    bias.raw_data = Some(vec![0; 16 * 8]);
    let g = decode(&m.encode_to_vec()).unwrap();
    let e = translate(&g, "Mlp", "mlp.onnx").unwrap_err().to_string();
    assert!(e.contains("Gemm (`/fc2/Gemm`: its bias is not f32"), "{e}");
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

/// The MLP with an `Expand` of its first ReLU's output to `shape` put before the
/// second layer: the translation's source, or its error.
fn mlp_with_expand(shape: &[i64]) -> Result<String, String> {
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(onnx::TensorProto {
        name: Some("expand_to".into()),
        dims: vec![shape.len() as i64],
        data_type: Some(onnx::tensor_proto::DataType::Int64 as i32),
        int64_data: shape.to_vec(),
        ..Default::default()
    });
    let relu = g.node.iter().position(|n| n.name() == "/Relu").unwrap();
    let relu_out = g.node[relu].output[0].clone();
    for n in &mut g.node {
        for i in &mut n.input {
            if *i == relu_out {
                *i = "expanded".into();
            }
        }
    }
    g.node.insert(
        relu + 1,
        onnx::NodeProto {
            name: Some("/Expand".into()),
            op_type: Some("Expand".into()),
            input: vec![relu_out, "expand_to".into()],
            output: vec!["expanded".into()],
            ..Default::default()
        },
    );
    let g = decode(&m.encode_to_vec()).unwrap();
    translate(&g, "Mlp", "mlp.onnx")
        .map(|t| t.source)
        .map_err(|e| e.to_string())
}

#[test]
fn an_expand_that_changes_nothing_is_dropped_and_one_that_does_says_why() {
    let plain = translate(&read(fixture("mlp.onnx")).unwrap(), "Mlp", "mlp.onnx")
        .unwrap()
        .source;
    assert_eq!(mlp_with_expand(&[1, 16]).unwrap(), plain);
    assert_eq!(mlp_with_expand(&[16]).unwrap(), plain);
    let e = mlp_with_expand(&[5, 3, 16]).unwrap_err();
    assert!(
        e.contains(
            "Expand (`/Expand`: an Expand of [BATCH, 16] to [5, 3, 16], which makes it larger"
        ),
        "{e}"
    );
}

/// Hostile integers for attributes and integer constants.
const HOSTILE: [i64; 6] = [-1, 0, 3, i64::MAX, i64::MIN, 1 << 40];

#[test]
fn hostile_attributes_and_constants_give_an_error_or_a_model_never_a_panic() {
    // Every integer attribute and every int64 constant of the decoder, the encoder and
    // the ops fixture set in turn to each hostile value: translation returns (a model,
    // or an error), whatever the file says.
    let (mut cases, mut refused) = (0, 0);
    for stem in ["decoder", "encoder", "ops"] {
        let bytes = std::fs::read(fixture(&format!("{stem}.onnx"))).unwrap();
        let model = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
        let nodes = model.graph.as_ref().unwrap().node.len();
        for at in 0..nodes {
            let node = &model.graph.as_ref().unwrap().node[at];
            let attributes = node.attribute.len();
            for a in 0..attributes {
                for v in HOSTILE {
                    let mut m = model.clone();
                    let attr = &mut m.graph.as_mut().unwrap().node[at].attribute[a];
                    let Some(t) = attr.t.as_mut().filter(|t| {
                        !t.int64_data.is_empty()
                            || t.raw_data
                                .as_ref()
                                .is_some_and(|r| r.len() % 8 == 0 && t.data_type == Some(7))
                    }) else {
                        if attr.i.is_some() {
                            attr.i = Some(v);
                        } else if !attr.ints.is_empty() {
                            attr.ints[0] = v;
                        } else {
                            continue;
                        }
                        refused += usize::from(!translate_survives(&m, stem, at));
                        cases += 1;
                        continue;
                    };
                    // An int64 constant: its first value.
                    if let Some(raw) = t.raw_data.as_mut() {
                        raw[..8].copy_from_slice(&v.to_le_bytes());
                    } else {
                        t.int64_data[0] = v;
                    }
                    refused += usize::from(!translate_survives(&m, stem, at));
                    cases += 1;
                }
            }
        }
    }
    // Most mutations break the model (some, of unread attributes, do not).
    assert!(
        cases > 1000 && refused > cases / 2,
        "{refused} of {cases} refused"
    );
}

/// Decodes and translates `m`, which must return rather than panic: whether it gave
/// a model.
fn translate_survives(m: &onnx::ModelProto, stem: &str, node: usize) -> bool {
    let bytes = m.encode_to_vec();
    let outcome = std::panic::catch_unwind(|| {
        decode(&bytes).is_ok_and(|g| translate(&g, "Hostile", "hostile.onnx").is_ok())
    });
    assert!(
        outcome.is_ok(),
        "{stem}: a mutation of node {node} panicked"
    );
    outcome.unwrap()
}
