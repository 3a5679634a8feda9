//! What can go wrong reading an ONNX file, each error naming where: the file, the node
//! (its name and op), the initializer or value. Names come from the file, so every
//! message shows them through [`shown`]: a hostile name cannot move a terminal's
//! cursor, clear its screen or forge a second line.

use std::path::PathBuf;

/// An ONNX import's error.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read `{}`: {source}", shown(&path.display().to_string()))]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An output file could not be written (the source, the checkpoint, or the folder
    /// holding them); no output of the import is left half-written.
    #[error("cannot write `{}`: {}", shown(&path.display().to_string()), shown(why))]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The bytes are not an ONNX model (truncated, or not protobuf at all).
    #[error("not an ONNX model: {}", shown(.0))]
    NotOnnx(String),
    /// The model is well-formed protobuf but breaks ONNX's rules or Kiln's limits (a
    /// cycle, a value nobody produces, an initializer whose dims and data disagree).
    #[error("invalid ONNX model: {}", shown(.0))]
    Invalid(String),
    /// Nodes Kiln cannot translate (at the model's opset), each named.
    #[error("{}", unsupported_message(.0, *.1))]
    Unsupported(Vec<UnsupportedNode>, i64),
    /// The model uses a feature Kiln does not import (an opset outside 13–21, external
    /// tensor data, a data type).
    #[error("cannot import: {}", shown(.0))]
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
        shown(&listed.join("; "))
    )
}

/// `text` safe to print: control characters (newlines, escape codes), Unicode's line
/// and paragraph separators and its bidirectional overrides escaped as `\u{..}`
/// (`\n`, `\t`, `\r` as such), everything else as it is.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a terminal or an editor could take `c` for something other than a
/// character of a name: a control character, a line or paragraph separator, or a
/// bidirectional formatting character (which can reorder what a reader sees).
pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
                | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// An import's result.
pub type Result<T> = std::result::Result<T, ImportError>;
