//! W1's MLP over int8 weights on the CPU: the checkpoint `kiln-quantize` writes from
//! an [`Mlp`](crate::mlp::Mlp) checkpoint, run through `kiln::cpu::quant`'s int8
//! products (ReLU fused into the first two). Written by hand beside the `#[model]`
//! MLP until `#[model(precision = int8)]` generates such forwards; the layer names,
//! the chain and the ReLUs are the MLP's (checked against its checkpoint on load).

use kiln::cpu::quant::{linear, Activation, Int8Matrix};
use kiln::train::checkpoint::int8::{read_int8, Int8Checkpoint};
use kiln::{Error, Result};
use std::path::Path;

/// The MLP's layers, in order, by their checkpoint names.
const LAYERS: [&str; 3] = ["fc1", "fc2", "fc3"];

/// The MLP with int8 weights and f32 biases.
pub struct MlpInt8 {
    layers: Vec<(Int8Matrix, Vec<f32>)>,
}

impl MlpInt8 {
    /// Reads an int8 checkpoint of the MLP; layers that do not chain (each one's
    /// inputs the previous one's outputs, 784 in and 10 out) are an error naming them.
    pub fn load(path: &Path) -> Result<Self> {
        Self::from_checkpoint(&read_int8(path)?)
            .map_err(|e| Error::invalid("int8 MLP", format!("`{}`: {e}", path.display())))
    }

    /// The MLP of an int8 checkpoint read already (`kiln::embed!(Mlp, .., int8)`'s).
    pub fn from_checkpoint(c: &Int8Checkpoint) -> Result<Self> {
        let mut layers = Vec::new();
        let mut inputs = 784;
        for name in LAYERS {
            let w = c.weight(&format!("{name}.weight"))?.clone();
            let b = c.values(&format!("{name}.bias"))?.to_vec();
            if w.cols() != inputs || b.len() != w.rows() {
                return Err(Error::shape(
                    "int8 MLP",
                    format!(
                        "`{name}` is [{}, {}] with {} biases, after {inputs} outputs",
                        w.rows(),
                        w.cols(),
                        b.len()
                    ),
                ));
            }
            inputs = w.rows();
            layers.push((w, b));
        }
        if inputs != 10 {
            return Err(Error::shape("int8 MLP", format!("{inputs} logits, not 10")));
        }
        Ok(MlpInt8 { layers })
    }

    /// Class logits (`batch × 10`) of `batch` flattened images (`batch × 784`).
    pub fn logits(&self, x: &[f32], batch: usize) -> Result<Vec<f32>> {
        let mut h = x.to_vec();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            let act = if i + 1 < self.layers.len() {
                Activation::Relu
            } else {
                Activation::None
            };
            let mut y = vec![0.0; batch * w.rows()];
            linear(&h, batch, w, Some(b), act, &mut y)?;
            h = y;
        }
        Ok(h)
    }
}
