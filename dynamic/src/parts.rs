//! The escape hatch from `#[model]`: a `#[dynamic]` field holds a [`DynamicModule`],
//! and a planned method calls it (`self.router.forward::<B, 64>(h)`). The build-time
//! plan holds a `Call` node there; when the program reaches it, [`PartCalls`] runs the
//! module's forward pass on the dynamic path (recorded, planned and cached like any
//! lazy graph) and, in a training entry, its backward pass from the gradient the plan
//! computed, keeping the module's parameter gradients for the model's `Grads`.

use crate::grad::Gradients;
use crate::lazy::{no_grad, LazyTensor};
use crate::module::DynamicModule;
use kiln_fusion::Parts;
use kiln_tensor::nn::Mode;
use kiln_tensor::{Backend, Error, RawTensor, Result};

/// A dynamic module's forward pass as a trait object (`DynamicModule` itself is not
/// one: `Module` builds values of `Self`); every `DynamicModule` is one.
pub trait PartForward<B: Backend> {
    /// The module's output for `x`.
    fn forward_part(&self, x: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>>;
}

impl<B: Backend, M: DynamicModule<B>> PartForward<B> for M {
    fn forward_part(&self, x: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>> {
        self.forward(x, mode)
    }
}

/// One call site: the module, and how messages name it.
type Site<'a, B> = (&'a dyn PartForward<B>, &'static str);

/// What a planned method's run calls out to: one entry per call site of a dynamic
/// part in the method (a part called twice has two), in the plan's part order.
pub struct PartCalls<'a, B: Backend> {
    sites: Vec<Site<'a, B>>,
    mode: Mode,
    /// Per call: its input (requiring a gradient) and output, kept for the backward
    /// pass of a training run.
    saved: Vec<Option<(LazyTensor<B>, LazyTensor<B>)>>,
    /// Per call: the gradients of its module's parameters, once its backward ran.
    grads: Vec<Option<Gradients<B>>>,
}

impl<'a, B: Backend> PartCalls<'a, B> {
    /// The call sites of a run in `mode` (training keeps what the backward pass needs,
    /// and gives call `k` the seed `seed ^ (k + 1)·φ`, so parts draw different masks).
    pub fn new(mode: Mode, sites: Vec<Site<'a, B>>) -> Self {
        let n = sites.len();
        PartCalls {
            sites,
            mode,
            saved: (0..n).map(|_| None).collect(),
            grads: (0..n).map(|_| None).collect(),
        }
    }

    fn site(&self, part: usize) -> Result<Site<'a, B>> {
        self.sites.get(part).copied().ok_or_else(|| {
            Error::invalid(
                "call",
                format!("the plan calls part {part} of {}", self.sites.len()),
            )
        })
    }

    /// The gradients of the parameters of the module behind `calls` (its call sites),
    /// summed over them: empty when none ran backward (the loss did not use it).
    pub fn gradients(&mut self, calls: &[usize]) -> Result<Gradients<B>> {
        let mut total = Gradients::default();
        for &k in calls {
            if let Some(g) = self.grads.get_mut(k).and_then(Option::take) {
                total.accumulate(g)?;
            }
        }
        Ok(total)
    }
}

impl<B: Backend> Parts<B> for PartCalls<'_, B> {
    fn name(&self, part: usize) -> String {
        self.sites
            .get(part)
            .map_or_else(|| format!("part {part}"), |s| s.1.to_string())
    }

    fn forward(&mut self, part: usize, input: RawTensor<B>) -> Result<RawTensor<B>> {
        let (module, name) = self.site(part)?;
        B::refuse_in_capture(input.device(), &|| {
            format!("`{name}`, a dynamic part (it records and plans its graph on the host at every call),")
        })?;
        match self.mode {
            Mode::Eval => no_grad(|| {
                module
                    .forward_part(&LazyTensor::from_raw(input), Mode::Eval)?
                    .value()
            }),
            Mode::Train { seed } => {
                let x = LazyTensor::leaf(input, true);
                let mode = Mode::Train {
                    seed: seed ^ (part as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                };
                let y = module.forward_part(&x, mode)?;
                let value = y.value()?;
                self.saved[part] = Some((x, y));
                Ok(value)
            }
        }
    }

    fn backward(&mut self, part: usize, grad: RawTensor<B>) -> Result<RawTensor<B>> {
        let (x, y) = self
            .saved
            .get_mut(part)
            .and_then(Option::take)
            .ok_or_else(|| {
                Error::invalid(
                    "call",
                    format!("the backward pass of part {part} ran before its forward pass"),
                )
            })?;
        if !y.requires_grad() {
            // The output depends on neither the input nor a parameter.
            self.grads[part] = Some(Gradients::default());
            return RawTensor::zeros(x.dims(), x.dtype(), x.device());
        }
        let grads = y.backward_from(LazyTensor::from_raw(grad))?;
        let dx = match grads.get(&x) {
            Some(g) => g.clone(),
            None => RawTensor::zeros(x.dims(), x.dtype(), x.device())?,
        };
        self.grads[part] = Some(grads);
        Ok(dx)
    }
}
