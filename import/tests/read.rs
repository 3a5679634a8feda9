//! Reading ONNX files: PyTorch's exports of an MLP, a CNN with batch norm, a
//! transformer encoder and a causal decoder (`scripts/onnx_fixtures.py`) read into
//! graphs whose nodes come after what they read; and malformed or hostile files (every
//! truncation of a real one, garbage, a cycle, a missing initializer, huge or negative
//! declared dims, an opset out of range, external data, subgraphs nested 1,000 deep)
//! each give one error, quickly and without allocating what they declare.

use kiln_import::onnx::{self, tensor_proto::DataLocation};
use kiln_import::{decode, read, read_tensor, Dim, Graph, ImportError, TensorData};
use prost::Message;
use std::collections::HashSet;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every node reads only values given (inputs, initializers) or produced before it.
fn assert_dependency_order(g: &Graph) {
    let mut known: HashSet<&str> = g.inputs.iter().map(|v| v.name.as_str()).collect();
    known.extend(g.initializers.keys().map(String::as_str));
    for n in &g.nodes {
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            assert!(
                known.contains(i.as_str()),
                "node `{}` reads `{i}` before it is produced",
                n.name
            );
        }
        known.extend(n.outputs.iter().map(String::as_str));
    }
    for o in &g.outputs {
        assert!(
            known.contains(o.name.as_str()),
            "output `{}` is never produced",
            o.name
        );
    }
}

#[test]
fn pytorch_exports_read_in_dependency_order() -> kiln_import::Result<()> {
    let mlp = read(fixture("mlp.onnx"))?;
    assert_eq!(mlp.opset, 17);
    assert!(mlp.producer.starts_with("pytorch"), "{}", mlp.producer);
    assert_eq!(mlp.inputs.len(), 1);
    assert_eq!(
        mlp.inputs[0].dims,
        Some(vec![Dim::Named("batch".into()), Dim::Fixed(20)])
    );
    let ops: Vec<&str> = mlp.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(ops, ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]);
    let w = &mlp.initializers["fc1.weight"];
    assert_eq!(w.dims, [16, 20]);
    assert!(matches!(&w.data, TensorData::F32(v) if v.len() == 320));
    for (name, nodes) in [("mlp", 5), ("cnn", 9), ("encoder", 345), ("decoder", 202)] {
        let g = read(fixture(&format!("{name}.onnx")))?;
        assert_eq!(g.nodes.len(), nodes, "{name}");
        assert_dependency_order(&g);
        let input = read_tensor(fixture(&format!("{name}/input_0.pb")))?;
        let declared = g.inputs[0].dims.as_ref().expect("declared dims");
        assert_eq!(input.dims.len(), declared.len(), "{name}'s input rank");
        let output = read_tensor(fixture(&format!("{name}/output_0.pb")))?;
        assert!(
            matches!(output.data, TensorData::F32(_)),
            "{name}'s output is f32"
        );
    }
    let cnn = read(fixture("cnn.onnx"))?;
    assert!(cnn.nodes.iter().any(|n| n.op == "BatchNormalization"));
    Ok(())
}

/// The MLP fixture as protobuf messages, to break.
fn mlp() -> onnx::ModelProto {
    let bytes = std::fs::read(fixture("mlp.onnx")).expect("the fixture");
    onnx::ModelProto::decode(bytes.as_slice()).expect("the fixture decodes")
}

/// The error of reading `model`, which must not read.
fn error_of(model: &onnx::ModelProto) -> ImportError {
    match decode(&model.encode_to_vec()) {
        Ok(_) => panic!("a broken model read"),
        Err(e) => e,
    }
}

fn initializer<'a>(m: &'a mut onnx::ModelProto, name: &str) -> &'a mut onnx::TensorProto {
    let g = m.graph.as_mut().expect("a graph");
    g.initializer
        .iter_mut()
        .find(|t| t.name() == name)
        .expect("the initializer")
}

#[test]
fn every_truncation_and_garbage_is_an_error() {
    let bytes = std::fs::read(fixture("mlp.onnx")).expect("the fixture");
    for len in 0..bytes.len() {
        assert!(
            decode(&bytes[..len]).is_err(),
            "the first {len} bytes read as a model"
        );
    }
    for garbage in [
        &b"not a model"[..],
        &[0xff; 64],
        &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
    ] {
        let e = decode(garbage).expect_err("garbage read");
        assert!(matches!(e, ImportError::NotOnnx(_)), "{e}");
    }
}

#[test]
fn subgraphs_nested_past_protobufs_recursion_limit_are_an_error_not_a_crash() {
    // An `If` node whose branch holds an `If` node whose branch... 1,000 deep: each
    // level a few bytes of file, decoded recursively by protobuf.
    let mut graph = onnx::GraphProto::default();
    for _ in 0..1_000 {
        let node = onnx::NodeProto {
            op_type: Some("If".into()),
            attribute: vec![onnx::AttributeProto {
                name: Some("then_branch".into()),
                r#type: Some(onnx::attribute_proto::AttributeType::Graph as i32),
                g: Some(graph),
                ..Default::default()
            }],
            ..Default::default()
        };
        graph = onnx::GraphProto {
            node: vec![node],
            ..Default::default()
        };
    }
    let mut m = mlp();
    m.graph = Some(graph);
    // Encoding is recursive too: on a thread with room for it.
    let bytes = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || m.encode_to_vec())
        .unwrap()
        .join()
        .unwrap();
    let e = decode(&bytes).expect_err("a 1,000-deep model read");
    assert!(matches!(e, ImportError::NotOnnx(_)), "{e}");
}

#[test]
fn broken_graphs_are_one_error_naming_the_problem() {
    let check = |model: onnx::ModelProto, wanted: &str| {
        let e = error_of(&model).to_string();
        assert!(e.contains(wanted), "wanted `{wanted}` in: {e}");
    };
    // A cycle: the first layer reads the last one's output.
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    let last = g.node.last().unwrap().output[0].clone();
    g.node[0].input[0] = last;
    check(m, "cycle");
    // A missing initializer.
    let mut m = mlp();
    m.graph
        .as_mut()
        .unwrap()
        .initializer
        .retain(|t| t.name() != "fc2.weight");
    check(
        m,
        "reads `fc2.weight`, which no input, initializer or node produces",
    );
    // A value produced twice.
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    g.node[1].output[0] = g.node[0].output[0].clone();
    check(m, "produced twice");
    // An output nothing produces.
    let mut m = mlp();
    m.graph.as_mut().unwrap().output[0].name = Some("nowhere".into());
    check(m, "output `nowhere` is produced by no node");
    // No graph at all.
    let mut m = mlp();
    m.graph = None;
    check(m, "no graph");
}

#[test]
fn declared_sizes_are_checked_against_the_data_before_anything_is_allocated() {
    let check = |dims: Vec<i64>, wanted: &str| {
        let mut m = mlp();
        initializer(&mut m, "fc1.weight").dims = dims;
        let e = error_of(&m).to_string();
        assert!(e.contains(wanted), "wanted `{wanted}` in: {e}");
    };
    // 2^80 values overflow; 2^50 would be 4 PiB of floats; -1 is no size.
    check(vec![1 << 40, 1 << 40], "too many values to hold");
    check(
        vec![1 << 30, 1 << 20],
        "(1125899906842624 values) but holds 320",
    );
    check(vec![-1, 20], "declares dims [-1, 20]");
    check(vec![16, 21], "(336 values) but holds 320");
    // Typed values (not raw bytes) are counted the same way.
    let mut m = mlp();
    let t = initializer(&mut m, "fc1.bias");
    t.float_data = vec![0.5; 3];
    t.raw_data = None;
    let e = error_of(&m).to_string();
    assert!(e.contains("(16 values) but holds 3"), "{e}");
}

#[test]
fn features_kiln_does_not_import_are_named() {
    let check = |m: onnx::ModelProto, wanted: &str| {
        let e = error_of(&m);
        assert!(matches!(e, ImportError::Feature(_)), "{e}");
        assert!(e.to_string().contains(wanted), "wanted `{wanted}` in: {e}");
    };
    for version in [9, 22] {
        let mut m = mlp();
        m.opset_import[0].version = Some(version);
        check(m, &format!("opset {version} (Kiln imports opsets 13 to 21"));
    }
    let mut m = mlp();
    initializer(&mut m, "fc1.weight").data_location = Some(DataLocation::External as i32);
    check(m, "external file");
    let mut m = mlp();
    initializer(&mut m, "fc1.weight").data_type = Some(onnx::tensor_proto::DataType::String as i32);
    check(m, "initializer `fc1.weight` is of type String");
}
