//! The compiled programs of one model: one [`Program`] per planned method, built from
//! its embedded plan text on first use, and the model's switch between fused plans and
//! op-by-op execution.

use crate::exec::{Natives, Program, RunContext};
use crate::parts::Parts;
use crate::plan::Plan;
use kiln_tensor::{Backend, RawTensor, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The compiled programs of one model, one per planned method, built on first use;
/// and whether the model runs its plans (fused) or op by op (unfused).
pub struct Programs<B: Backend> {
    unfused: AtomicBool,
    programs: Mutex<Vec<Option<Program<B>>>>,
}

impl<B: Backend> Default for Programs<B> {
    fn default() -> Self {
        Programs {
            unfused: AtomicBool::new(false),
            programs: Mutex::new(Vec::new()),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Programs<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Programs {{ fused: {} }}", self.fused())
    }
}

impl<B: Backend> Clone for Programs<B> {
    /// A clone starts without compiled programs (they hold buffers of the original).
    fn clone(&self) -> Self {
        let p = Programs::default();
        p.set_fused(self.fused());
        p
    }
}

impl<B: Backend> Programs<B> {
    /// Whether methods run through their fused plans (the default).
    pub fn fused(&self) -> bool {
        !self.unfused.load(Ordering::Relaxed)
    }

    /// Chooses fused plans (`true`) or op-by-op execution (`false`).
    pub fn set_fused(&self, on: bool) {
        self.unfused.store(!on, Ordering::Relaxed);
    }

    /// Runs `f` on program `id`, built from `plan_text` and `natives` on first use.
    pub fn with<R>(
        &self,
        id: usize,
        plan_text: &str,
        natives: &'static Natives,
        f: impl FnOnce(&mut Program<B>) -> Result<R>,
    ) -> Result<R> {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if programs.len() <= id {
            programs.resize_with(id + 1, || None);
        }
        if programs[id].is_none() {
            programs[id] = Some(Program::new(Plan::parse(plan_text)?, natives));
        }
        f(programs[id].as_mut().expect("built above"))
    }

    /// Runs program `id` (built from `plan_text` and `natives` on first use) on
    /// `inputs` in the context `cx`: through its fused plan when the model runs fused
    /// and the plan describes these inputs, else op by op (always in anomaly mode,
    /// [`kiln_tensor::anomaly`]). `take` receives the outputs in order (a fused run
    /// hands over its buffers without allocating). The outputs are also handed, as
    /// they are computed, to the watcher [`kiln_tensor::collective::watch_outputs`]
    /// set around the outermost method call. What the generated methods of a
    /// `#[model]` call; see [`Program::run`].
    pub fn call<R>(
        &self,
        id: usize,
        plan_text: &str,
        natives: &'static Natives,
        cx: RunContext<'_, B>,
        inputs: &[&RawTensor<B>],
        take: impl FnOnce(&mut dyn Iterator<Item = RawTensor<B>>) -> R,
    ) -> Result<R> {
        let mut take = Some(take);
        let mut taken = None;
        self.call_with(id, plan_text, natives, cx, inputs, &mut |outputs| {
            let take = take.take().expect("a program hands its outputs over once");
            taken = Some(take(outputs));
        })?;
        Ok(taken.expect("a program that succeeds hands its outputs over"))
    }

    /// [`Programs::call`] with its receiver of the outputs behind a reference: generic
    /// over the backend only, so a program that uses a backend whose executor is
    /// compiled upstream (the CPU's, see [`crate::instances`]) links to that copy.
    #[inline(never)]
    pub(crate) fn call_with(
        &self,
        id: usize,
        plan_text: &str,
        natives: &'static Natives,
        cx: RunContext<'_, B>,
        inputs: &[&RawTensor<B>],
        take: &mut dyn FnMut(&mut dyn Iterator<Item = RawTensor<B>>),
    ) -> Result<()> {
        // Anomaly mode checks every op's value, which only op-by-op execution has.
        let fused = self.fused() && !kiln_tensor::anomaly::detecting();
        let RunContext {
            device,
            sizes,
            seeds,
            parts,
            watch,
        } = cx;
        kiln_tensor::collective::with_output_watcher(|outermost| {
            let mut cx = RunContext {
                device,
                sizes,
                seeds,
                parts: parts.map(|p| p as &mut dyn Parts<B>),
                watch: match watch {
                    Some(w) => Some(w as &mut dyn FnMut(&dyn std::any::Any)),
                    None => outermost.map(|w| w as &mut dyn FnMut(&dyn std::any::Any)),
                },
            };
            self.with(id, plan_text, natives, |p| {
                // A gather's index out of range is named as the id or label it was.
                let named = |p: &Program<B>, e| crate::exec::name_index_error(p.plan(), e);
                if fused {
                    let failed = match p.run(&mut cx, inputs) {
                        Ok(Some(mut outputs)) => {
                            take(&mut outputs);
                            return Ok(());
                        }
                        Ok(None) => None,
                        Err(e) => Some(e),
                    };
                    if let Some(e) = failed {
                        return Err(named(p, e));
                    }
                }
                let outputs = p.run_op_by_op(&mut cx, inputs).map_err(|e| named(p, e))?;
                take(&mut outputs.into_iter());
                Ok(())
            })
        })
    }
}
