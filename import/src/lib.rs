//! Kiln's ONNX import. An ONNX file is read without trusting it and checked into a
//! [`Graph`] ([`read`], [`decode`]): protobuf decoded by `prost`'s messages for ONNX's
//! own schema ([`onnx`]), nodes ordered by their dependencies, every value produced
//! once, initializers holding exactly what their dims declare, an opset Kiln imports.
//! Each problem is one [`ImportError`] naming the node, value or initializer.

mod error;
mod model;
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod onnx;

pub use error::{ImportError, Result};
pub use model::{
    decode, read, read_tensor, Attribute, Dim, ElementType, Graph, Node, Tensor, TensorData, Value,
    MAX_FILE_BYTES, MAX_OPSET, MIN_OPSET,
};
