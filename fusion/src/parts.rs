//! Calls out of a plan: the [`Parts`] a program calls when it reaches a
//! `NodeKind::Call` (a part of the model written on the dynamic path, which the
//! build-time plan does not see), and the checks at that boundary, shared by the fused
//! and the op-by-op paths so both refuse the same results with the same message.

use crate::sym::SDim;
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{Backend, Error, RawTensor, Result, TensorMeta};

/// The parts a program calls out to, by the index the plan's `Call` nodes carry.
pub trait Parts<B: Backend> {
    /// How messages name part `part` (`self.router.forward`).
    fn name(&self, part: usize) -> String;

    /// Runs part `part` on `input`.
    fn forward(&mut self, part: usize, input: RawTensor<B>) -> Result<RawTensor<B>>;

    /// The gradient of part `part`'s input from the gradient of its output, after its
    /// forward pass in the same run; the part keeps its parameters' gradients.
    fn backward(&mut self, part: usize, grad: RawTensor<B>) -> Result<RawTensor<B>>;
}

/// No parts: what plans of models without dynamic parts run with.
pub struct NoParts;

impl<B: Backend> Parts<B> for NoParts {
    fn name(&self, part: usize) -> String {
        format!("part {part}")
    }

    fn forward(&mut self, part: usize, _: RawTensor<B>) -> Result<RawTensor<B>> {
        Err(missing(part))
    }

    fn backward(&mut self, part: usize, _: RawTensor<B>) -> Result<RawTensor<B>> {
        Err(missing(part))
    }
}

fn missing(part: usize) -> Error {
    Error::invalid(
        "call",
        format!("the plan calls part {part}, but the caller gave no parts"),
    )
}

/// Runs part `part` forward (`grad: false`) or backward on `input`, checking what it
/// returns against `want` (the dims and dtype the call declared, resolved for this
/// run): a mismatch names the part, what it returned and what was declared
/// (`declared`, the declaration as written: `[B, 64]`). Errors inside the part say
/// which part, called on what. Messages are only written on failure: this runs every
/// step.
pub fn call_part<B: Backend>(
    parts: &mut dyn Parts<B>,
    part: usize,
    grad: bool,
    input: RawTensor<B>,
    want: &TensorMeta,
    declared: &[SDim],
) -> Result<RawTensor<B>> {
    let (given_dims, given_dtype) = (*input.dims(), input.dtype());
    let result = if grad {
        parts.backward(part, input)
    } else {
        parts.forward(part, input)
    };
    let out = result.map_err(|e| {
        let name = parts.name(part);
        let at = if grad {
            format!("the backward pass of `{name}`, given a gradient")
        } else {
            format!("`{name}`, called on")
        };
        e.with_context(&format!(
            "in {at} {given_dtype} {}",
            fmt_dims(given_dims.as_slice())
        ))
    })?;
    if out.dims().as_slice() == want.dims.as_slice() && out.dtype() == want.dtype {
        return Ok(out);
    }
    let name = parts.name(part);
    let dims_differ = out.dims().as_slice() != want.dims.as_slice();
    let (got, resolved) = (
        format!("{} {}", out.dtype(), fmt_dims(out.dims().as_slice())),
        format!("{} {}", want.dtype, fmt_dims(&want.dims)),
    );
    let declared: Vec<String> = declared.iter().map(|d| d.to_string()).collect();
    let declared = format!("[{}]", declared.join(", "));
    let msg = if grad {
        format!("the backward pass of `{name}` returned {got} as its input's gradient, but its input is {resolved}")
    } else if declared == fmt_dims(&want.dims) {
        format!("`{name}` returned {got}, but the call declares {resolved}")
    } else {
        format!("`{name}` returned {got}, but the call declares {resolved} ({declared})")
    };
    Err(if dims_differ {
        Error::shape("call", msg)
    } else {
        Error::dtype("call", msg)
    })
}
