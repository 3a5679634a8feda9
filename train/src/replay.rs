//! Training steps replayed as graphs. [`StepReplay`] runs a model's training step
//! planned, captures it once warm on a backend that captures (CUDA graphs), and then
//! replays it: each batch is written into the captured step's input buffers, and the
//! values that change between steps (the learning rate, Adam's bias corrections, the
//! dropout seed) into device memory, before each replay. Where a replay would train
//! wrongly (an optimizer that replaces parameters), steps run planned and the first
//! step's notice says why.

use crate::optim::Optimizer;
use crate::parallel::GradExchange;
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, Collective, HostData, RawTensor, Replay, Result};
use std::rc::Rc;

/// A captured step: its replay, the input buffers it reads and the loss it writes.
struct Captured<B: Backend> {
    replay: Box<dyn Replay>,
    inputs: Vec<RawTensor<B>>,
    loss: RawTensor<B>,
}

/// One input of a training step: its values on the host and its dims.
pub struct StepInput<'a> {
    /// The values, row-major.
    pub data: HostData,
    /// The dims.
    pub dims: &'a [usize],
}

/// What one training step run through [`StepReplay::step`] reports.
#[derive(Debug)]
pub struct StepOutcome {
    /// The batch's loss.
    pub loss: f32,
    /// A one-line notice on the step it concerns: the step was captured and later
    /// steps replay it, or why steps are not replayed.
    pub notice: Option<String>,
}

/// Runs a training loop's steps planned, or captured once warm and replayed.
pub struct StepReplay<B: Backend> {
    device: B::Device,
    /// Whether steps are captured once warm (asked for, the backend captures and the
    /// optimizer replays correctly).
    captures: bool,
    /// Whether the step draws random values (its seed goes into device memory).
    draws: bool,
    graph: Option<Captured<B>>,
    steps: u64,
    notice: Option<String>,
    /// The ranks this one averages its gradients and loss with (data parallelism),
    /// and how.
    ranks: Option<(Rc<dyn Collective<B>>, GradExchange)>,
}

/// A model's loss and gradients on a step's inputs, uploaded to the device.
pub type LossAndGrad<'a, B, M> =
    dyn FnMut(&M, &[RawTensor<B>]) -> Result<(RawTensor<B>, <M as Module<B>>::Grads)> + 'a;

impl<B: Backend> StepReplay<B> {
    /// Steps on `device`, captured once warm and replayed when `replay` is asked and
    /// the backend captures, unless `opt` would not replay correctly or anomaly mode is
    /// on (the first step's notice then says why). `draws`: whether the step draws random values (dropout).
    pub fn new(
        device: &B::Device,
        replay: bool,
        opt: &(impl Optimizer<B> + ?Sized),
        draws: bool,
    ) -> Self {
        let asked = replay && B::captures(device);
        let refusal = match asked {
            // Anomaly mode reads every op's value back, which a capture cannot hold.
            true if kiln_tensor::anomaly::detecting() => {
                Some("anomaly mode checks every op's value as it runs".to_string())
            }
            true => opt.replay_refusal(),
            false => None,
        };
        StepReplay {
            device: device.clone(),
            captures: asked && refusal.is_none(),
            draws,
            graph: None,
            steps: 0,
            notice: refusal.map(|why| {
                format!("the training step is not replayed as a graph: {why}; it runs planned")
            }),
            ranks: None,
        }
    }

    /// Steps of one rank of a data-parallel run: each step's gradients (and its loss)
    /// are averaged over `ranks` before the optimizer's step, so that every rank takes
    /// the step of the whole batch. A collective whose exchanges are device work (NCCL)
    /// is captured with the step and replayed with it; one through the host makes the
    /// steps run planned. With more than one rank, gradients are sent in buckets as
    /// the backward pass computes them ([`GradExchange`]); with one there is no link
    /// time to hide, and they are averaged after it on the step's own stream (on the
    /// H200 the cheaper of the two). The environment variable `KILN_OVERLAP` set to
    /// `1` or `0` makes either the choice whatever the ranks (any other value is an
    /// error).
    pub fn data_parallel(mut self, ranks: Box<dyn Collective<B>>) -> Result<Self> {
        if self.captures && !ranks.captures() {
            self.captures = false;
            self.notice = Some(
                "the training step is not replayed as a graph: data-parallel steps exchange gradients between ranks outside a capture; it runs planned".into(),
            );
        }
        let overlap = match std::env::var("KILN_OVERLAP") {
            Err(_) => ranks.world() > 1,
            Ok(v) if v == "1" => true,
            Ok(v) if v == "0" => false,
            Ok(v) => {
                return Err(kiln_tensor::Error::invalid(
                    "KILN_OVERLAP",
                    format!(
                    "`{v}` is neither 1 (gradients sent during the backward pass) nor 0 (after it)"
                ),
                ))
            }
        };
        let exchange = match overlap {
            true => GradExchange::new(),
            false => GradExchange::after_backward(),
        };
        self.ranks = Some((Rc::from(ranks), exchange));
        Ok(self)
    }

    /// Whether later steps replay a captured one.
    pub fn replaying(&self) -> bool {
        self.graph.is_some()
    }

    /// Runs one training step of `model` on `inputs`: `loss_and_grad` gives the loss
    /// and gradients on the inputs uploaded to the device, then `opt` takes its step.
    /// The second step is captured where steps replay, and later ones replay it with
    /// their inputs written into its buffers (`inputs` must keep their dims: an error
    /// otherwise). The model's step seeds are in device memory from the capture on:
    /// call [`StepReplay::finish`] when done.
    pub fn step<M: Module<B>, O: Optimizer<B>>(
        &mut self,
        model: &mut M,
        opt: &mut O,
        inputs: Vec<StepInput<'_>>,
        loss_and_grad: &mut LossAndGrad<'_, B, M>,
    ) -> Result<StepOutcome> {
        if self.captures && self.steps == 0 && model.loss_scale().is_some() {
            self.captures = false;
            self.notice = Some(
                "the training step is not replayed as a graph: its loss scaling decides on the host whether each step is taken; it runs planned".into(),
            );
        }
        let mut parts = Parts {
            model,
            opt,
            loss_and_grad,
        };
        self.step_parts(&mut parts, inputs)
    }

    /// [`StepReplay::step`] of any model and optimizer.
    #[inline(never)]
    pub(crate) fn step_parts(
        &mut self,
        parts: &mut dyn StepParts<B>,
        inputs: Vec<StepInput<'_>>,
    ) -> Result<StepOutcome> {
        let device = &self.device;
        if self.captures && self.steps >= 1 {
            // Outside the captured work: a replay reads these from device memory.
            parts.prepare(self.draws, device)?;
        }
        let loss = match &self.graph {
            Some(graph) => {
                if inputs.len() != graph.inputs.len() {
                    return Err(kiln_tensor::Error::invalid(
                        "replay",
                        format!(
                            "the captured step takes {} inputs, not {}",
                            graph.inputs.len(),
                            inputs.len()
                        ),
                    ));
                }
                for (input, buffer) in inputs.iter().zip(&graph.inputs) {
                    check_dims(input, buffer)?;
                    B::write_host(buffer, &input.data)?;
                }
                graph.replay.replay()?;
                parts.replayed();
                if let Some((ranks, _)) = &self.ranks {
                    // The replay's exchanges wait on the other ranks: under the timeout.
                    ranks.watch()?;
                }
                graph.loss.to_vec::<f32>()?[0]
            }
            None => {
                let uploaded = inputs
                    .into_iter()
                    .map(|i| RawTensor::from_host(i.data, i.dims, device))
                    .collect::<Result<Vec<_>>>()?;
                if self.captures && self.steps >= 1 {
                    let mut out = None;
                    let ranks = &mut self.ranks;
                    let replay = B::capture(device, &mut || {
                        out = Some(parts.train(ranks, &uploaded)?);
                        Ok(())
                    })?;
                    let loss = out.expect("a captured step ran and returned its loss");
                    let value = loss.to_vec::<f32>()?[0];
                    self.notice = Some(
                        "the training step is captured as a graph; later steps replay it".into(),
                    );
                    self.graph = Some(Captured {
                        replay,
                        inputs: uploaded,
                        loss,
                    });
                    value
                } else {
                    parts.train(&mut self.ranks, &uploaded)?.to_vec::<f32>()?[0]
                }
            }
        };
        if let Some((ranks, exchange)) = &self.ranks {
            // A step whose exchange was aborted (a peer died) computed nothing.
            ranks.watch()?;
            if self.steps == 1 {
                let (during, all) = exchange.sent_during_backward();
                let sent = match exchange.during_backward() {
                    true => format!(
                        "{during} of {all} gradients are sent to the other ranks during the backward pass"
                    ),
                    false => format!(
                        "the {all} gradients are averaged over the ranks after the backward pass"
                    ),
                };
                self.notice = Some(match self.notice.take() {
                    Some(notice) => format!("{notice}; {sent}"),
                    None => format!("data-parallel steps: {sent}"),
                });
            }
        }
        self.steps += 1;
        Ok(StepOutcome {
            loss,
            notice: self.notice.take(),
        })
    }

    /// Returns the model's step seeds to the host (seeds left in device memory would
    /// be read, unchanged, by every later step).
    pub fn finish<M: Module<B>>(self, model: &M) {
        if let Some(seeds) = model.step_seeds() {
            seeds.keep_on_host();
        }
    }
}

/// A step's model, optimizer and loss as [`StepReplay::step_parts`] sees them: object
/// safe, so the replay is compiled once per backend (the CPU's copy in this crate,
/// `instances.rs`), not once per model.
pub(crate) trait StepParts<B: Backend> {
    /// Writes the coming step's per-step values into device memory, where a replay
    /// reads them: the optimizer's, and the dropout seed when the step `draws`.
    fn prepare(&mut self, draws: bool, device: &B::Device) -> Result<()>;
    /// Counts a replayed step on the host ([`Optimizer::step_replayed`]).
    fn replayed(&mut self);
    /// The step's loss on `inputs` (averaged over `ranks` where there are), its
    /// gradients applied by the optimizer.
    fn train(
        &mut self,
        ranks: &mut Option<(Rc<dyn Collective<B>>, GradExchange)>,
        inputs: &[RawTensor<B>],
    ) -> Result<RawTensor<B>>;
}

/// A [`StepParts`]: what [`StepReplay::step`] was given.
struct Parts<'p, 'l, B: Backend, M: Module<B>, O> {
    model: &'p mut M,
    opt: &'p mut O,
    loss_and_grad: &'p mut LossAndGrad<'l, B, M>,
}

impl<B: Backend, M: Module<B>, O: Optimizer<B>> StepParts<B> for Parts<'_, '_, B, M, O> {
    fn prepare(&mut self, draws: bool, device: &B::Device) -> Result<()> {
        self.opt.prepare_step()?;
        if let (true, Some(seeds)) = (draws, self.model.step_seeds()) {
            seeds.advance_on_device(device)?;
        }
        Ok(())
    }

    fn replayed(&mut self) {
        self.opt.step_replayed();
    }

    fn train(
        &mut self,
        ranks: &mut Option<(Rc<dyn Collective<B>>, GradExchange)>,
        inputs: &[RawTensor<B>],
    ) -> Result<RawTensor<B>> {
        let (loss, grads) = rank_step(ranks, self.model, inputs, self.loss_and_grad)?;
        self.opt.step(self.model, &grads)?;
        Ok(loss)
    }
}

/// The loss and gradients of `model` on `inputs`, averaged over `ranks` where the step
/// is one rank's of a data-parallel run.
fn rank_step<B: Backend, M: Module<B>>(
    ranks: &mut Option<(Rc<dyn Collective<B>>, GradExchange)>,
    model: &mut M,
    inputs: &[RawTensor<B>],
    loss_and_grad: &mut LossAndGrad<'_, B, M>,
) -> Result<(RawTensor<B>, M::Grads)> {
    match ranks {
        Some((ranks, exchange)) => exchange.run(ranks, model, |m| loss_and_grad(m, inputs)),
        None => loss_and_grad(model, inputs),
    }
}

/// An error unless `input` has the dims of the captured buffer it is written into.
fn check_dims<B: Backend>(input: &StepInput<'_>, buffer: &RawTensor<B>) -> Result<()> {
    if input.dims != buffer.dims().as_slice() || input.data.dtype() != buffer.dtype() {
        return Err(kiln_tensor::Error::shape(
            "replay",
            format!(
                "the captured step reads {} {:?}, but this step's input is {} {:?}",
                buffer.dtype(),
                buffer.dims().as_slice(),
                input.data.dtype(),
                input.dims
            ),
        ));
    }
    Ok(())
}
