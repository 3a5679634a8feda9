//! Kiln's ONNX import. An ONNX file is read without trusting it and checked into a
//! [`Graph`] ([`read`], [`decode`]): protobuf decoded by `prost`'s messages for ONNX's
//! own schema ([`onnx`]), nodes ordered by their dependencies, every value produced
//! once, initializers holding exactly what their dims declare, an opset Kiln imports.
//! Each problem is one [`ImportError`] naming the node, value or initializer.
//!
//! A checked graph is translated into `#[model]` source ([`translate`]): a struct of
//! named layers and its `forward`, sizes as literals and symbolic dims as `const`
//! parameters, with a checkpoint of the layers' tensors in Kiln's names and layout.
//! [`import`] writes both files (the `kiln-import` binary and build scripts call it).

mod error;
mod files;
mod fold;
mod model;
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod onnx;
mod translate;

pub use error::{shown, ImportError, Result, UnsupportedNode};
pub use files::{import, write_checkpoint, Imported};
pub use model::{
    decode, read, read_tensor, Attribute, Dim, ElementType, Graph, Node, Tensor, TensorData, Value,
    MAX_FILE_BYTES, MAX_OPSET, MIN_OPSET,
};
pub use translate::{model_name, translate, Translation};
