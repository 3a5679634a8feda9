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
    /// The model uses a feature Kiln does not import (an opset outside 13–21, external
    /// tensor data, a data type).
    #[error("cannot import: {0}")]
    Feature(String),
}

/// An import's result.
pub type Result<T> = std::result::Result<T, ImportError>;
