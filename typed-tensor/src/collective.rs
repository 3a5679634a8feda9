//! The `Collective` trait: how the ranks of a data-parallel run (replicas of one model,
//! each on its own device or thread) exchange tensors. Declared here, beside
//! [`Backend`], so that a backend crate implements it for its own devices (NCCL on
//! CUDA) and the training strategy in `kiln-train` is written once against it.
//!
//! Also here: [`watch_outputs`], which hands the outputs of the model methods a closure
//! calls to a watcher as soon as each is computed, so that a data-parallel step sends a
//! bucket of gradients while the rest of the backward pass still runs. Generated model
//! methods take no context argument, so the watcher reaches them through a scoped,
//! owned thread-local that only `Programs::call` reads; everything below it (the
//! `Program` runs) receives it as part of its run context.

use crate::backend::Backend;
use crate::error::Result;
use crate::raw::RawTensor;
use std::any::Any;
use std::cell::RefCell;

/// How ranks exchange tensors: every rank calls the same operations, in the same order,
/// with tensors of the same dims and dtypes. A call waits for every rank; a rank that
/// died or fell behind makes it fail with an error, never hang forever.
pub trait Collective<B: Backend> {
    /// This rank's number, `0..world`.
    fn rank(&self) -> usize;
    /// How many ranks there are.
    fn world(&self) -> usize;
    /// Each of `tensors` averaged element-wise over the ranks, the same bits on every
    /// rank. The tensors are one bucket: an implementation may send them together.
    fn all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>>;
    /// Rank `root`'s `tensors`, on every rank.
    fn broadcast(&self, tensors: &[RawTensor<B>], root: usize) -> Result<Vec<RawTensor<B>>>;
    /// Whether its exchanges are device work that a captured graph can hold and replay
    /// (NCCL's are); exchanges through the host are not.
    fn captures(&self) -> bool {
        false
    }
    /// Starts [`Collective::all_reduce_mean`] of `tensors` beside the work queued
    /// after it (NCCL: on a stream of its own, overlapping the rest of a backward
    /// pass). The results may be read, and `tensors` written, only by work queued
    /// after [`Collective::finish_exchanges`]. By default the exchange is made at once.
    fn start_all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        self.all_reduce_mean(tensors)
    }
    /// Orders the work queued from now on after every exchange started so far.
    fn finish_exchanges(&self) -> Result<()> {
        Ok(())
    }
    /// Puts the device work queued so far (a replayed graph's exchanges included) under
    /// the group's timeout: where an exchange in it does not end in time (a peer died
    /// mid-exchange), the group is aborted and later calls fail. An error if the group
    /// has failed.
    fn watch(&self) -> Result<()> {
        Ok(())
    }
}

/// A watcher of computed outputs: told each output (a `RawTensor<B>` behind the
/// `&dyn Any`) as soon as the work computing it is queued.
pub type OutputWatch = Box<dyn FnMut(&dyn Any)>;

thread_local! {
    /// The watcher of the model methods this thread runs, if one is set: owned, so
    /// nothing borrowed outlives its scope.
    static WATCHER: RefCell<Option<OutputWatch>> = const { RefCell::new(None) };
}

/// Runs `body`, handing `watch` each output of the model methods `body` calls on this
/// thread (`#[model]` methods, through `Programs::call`) as soon as the kernel
/// computing it is queued, so that work on it (sending a gradient to the other ranks)
/// can start while the method's later kernels run. Planned and op-by-op runs both
/// hand their outputs out. Only outermost runs are watched: a plan run inside another
/// (a model's dynamic part) is not. The watcher is owned (what it records, it shares
/// with its caller, in an `Rc`), so nothing borrowed outlives the call.
pub fn watch_outputs<R>(watch: OutputWatch, body: impl FnOnce() -> R) -> R {
    /// Puts back the watcher that was set before, however `body` ends.
    struct Restore(Option<OutputWatch>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            WATCHER.with(|w| *w.borrow_mut() = before);
        }
    }
    let _restore = Restore(WATCHER.with(|w| w.borrow_mut().replace(watch)));
    body()
}

/// Runs `f` with this thread's output watcher (see [`watch_outputs`]), taken for the
/// call so that plans run inside `f` are not watched: what a model's method calls
/// around its plan's run.
pub fn with_output_watcher<R>(
    f: impl FnOnce(Option<&mut (dyn FnMut(&dyn Any) + 'static)>) -> R,
) -> R {
    /// Hands the watcher back to the thread-local, however `f` ends.
    struct Return(Option<OutputWatch>);
    impl Drop for Return {
        fn drop(&mut self) {
            if let Some(watch) = self.0.take() {
                WATCHER.with(|w| *w.borrow_mut() = Some(watch));
            }
        }
    }
    let mut taken = Return(WATCHER.with(|w| w.borrow_mut().take()));
    f(taken.0.as_deref_mut())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_is_lent_to_one_run_at_a_time_and_put_back_after_a_panic() {
        let seen = std::rc::Rc::new(RefCell::new(Vec::new()));
        let record = seen.clone();
        let watch = move |v: &dyn Any| record.borrow_mut().push(*v.downcast_ref::<u32>().unwrap());
        watch_outputs(Box::new(watch), || {
            with_output_watcher(|outer| {
                let outer = outer.expect("the watcher is lent to the outermost run");
                outer(&1u32);
                // A run inside it (a dynamic part's plan) is not watched.
                with_output_watcher(|inner| assert!(inner.is_none()));
                outer(&2u32);
            });
            // A run that panics hands the watcher back as it unwinds.
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_output_watcher(|_| panic!("a failing run"))
            }));
            assert!(caught.is_err());
            with_output_watcher(|again| again.expect("handed back")(&3u32));
        });
        with_output_watcher(|after| assert!(after.is_none(), "the watcher outlived its call"));
        assert_eq!(*seen.borrow(), [1, 2, 3]);
    }
}
