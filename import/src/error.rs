//! What can go wrong reading an ONNX file, each error naming where: the file, the node
//! (its name and op), the initializer or value.

use std::path::PathBuf;

/// An ONNX import's error.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not an ONNX model (truncated, or not protobuf at all).
    #[error("not an ONNX model: {0}")]
    NotOnnx(String),
    /// The model is well-formed protobuf but breaks ONNX's rules or Kiln's limits (a
    /// cycle, a value nobody produces, an initializer whose dims and data disagree).
    #[error("invalid ONNX model: {0}")]
    Invalid(String),
    /// Nodes Kiln cannot translate (at the model's opset), each named.
    #[error("{}", unsupported_message(.0, *.1))]
    Unsupported(Vec<UnsupportedNode>, i64),
    /// The model uses a feature Kiln does not import (an opset outside 13–21, external
    /// tensor data, a data type).
    #[error("cannot import: {0}")]
    Feature(String),
}

/// A node Kiln cannot translate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedNode {
    /// The node's name (`/fc1/Gemm`), or its position where it has none.
    pub node: String,
    /// Its op (`Einsum`), prefixed by its domain where that is not ONNX's own.
    pub op: String,
    /// Why, where the op is translated but not this use of it.
    pub why: Option<String>,
}

/// The message of [`ImportError::Unsupported`]: each op once, in order of first use,
/// with its nodes (the first few named) and why where a node says.
fn unsupported_message(nodes: &[UnsupportedNode], opset: i64) -> String {
    let mut ops: Vec<(&str, Vec<&UnsupportedNode>)> = Vec::new();
    for n in nodes {
        match ops.iter_mut().find(|(op, _)| *op == n.op) {
            Some((_, list)) => list.push(n),
            None => ops.push((&n.op, vec![n])),
        }
    }
    let listed: Vec<String> = ops
        .iter()
        .map(|(op, list)| {
            let mut named: Vec<String> = list
                .iter()
                .take(3)
                .map(|n| match &n.why {
                    Some(why) => format!("`{}`: {why}", n.node),
                    None => format!("`{}`", n.node),
                })
                .collect();
            if list.len() > 3 {
                named.push(format!("{} more", list.len() - 3));
            }
            format!("{op} ({})", named.join(", "))
        })
        .collect();
    format!(
        "cannot translate {} node{} at opset {opset}: {} (docs/onnx-import.md lists what is translated)",
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        listed.join("; ")
    )
}

/// An import's result.
pub type Result<T> = std::result::Result<T, ImportError>;
