//! Compile-time checks that need arithmetic on dims, as post-monomorphization const
//! assertions. They fire when the code is built (`cargo build`, `cargo test`), not
//! under `cargo check`, and their messages carry the numbers involved.

use crate::shape::{Shape, MAX_STATIC_RANK};
use const_panic::concat_panic;
use std::marker::PhantomData;

/// `S1` and `S2` hold the same number of elements (when both are static).
pub struct ReshapeCheck<S1, S2>(PhantomData<(S1, S2)>);

impl<S1: Shape, S2: Shape> ReshapeCheck<S1, S2> {
    /// Evaluating this constant performs the check.
    pub const OK: () = match (S1::NUMEL, S2::NUMEL) {
        (Some(a), Some(b)) if a != b => concat_panic!(
            "\n\nshape error: cannot reshape a tensor of ",
            a,
            " elements into a shape of ",
            b,
            " elements\n"
        ),
        _ => (),
    };
}

/// `S1` broadcasts to `S2` under NumPy rules (checked where both dims are static).
pub struct BroadcastCheck<S1, S2>(PhantomData<(S1, S2)>);

impl<S1: Shape, S2: Shape> BroadcastCheck<S1, S2> {
    /// Evaluating this constant performs the check.
    pub const OK: () = broadcast_ok(&S1::DIMS, S1::RANK, &S2::DIMS, S2::RANK);
}

const fn broadcast_ok(
    from: &[Option<usize>; MAX_STATIC_RANK],
    from_rank: usize,
    to: &[Option<usize>; MAX_STATIC_RANK],
    to_rank: usize,
) {
    if from_rank > to_rank {
        concat_panic!(
            "\n\nshape error: cannot broadcast a rank-",
            from_rank,
            " tensor to lower rank ",
            to_rank,
            "\n"
        );
    }
    let mut i = 0;
    while i < from_rank {
        let j = to_rank - from_rank + i;
        if let (Some(f), Some(t)) = (from[i], to[j]) {
            if f != t && f != 1 {
                concat_panic!(
                    "\n\nshape error: cannot broadcast dim ",
                    i,
                    " of size ",
                    f,
                    " to size ",
                    t,
                    " (only size-1 dims broadcast)\n"
                );
            }
        }
        i += 1;
    }
}

/// The shape type `S` is fully static (no `Dyn`), as constructors without dims need.
pub struct StaticCheck<S>(PhantomData<S>);

impl<S: Shape> StaticCheck<S> {
    /// Evaluating this constant performs the check.
    pub const OK: () = if S::NUMEL.is_none() {
        concat_panic!("\n\nshape error: this constructor needs a fully static shape; pass the dims of `Dyn` axes with the `_dims` variant\n")
    };
}

/// A sliding window's output size: `(input + 2·pad − dilation·(kernel−1) − 1)/stride + 1`
/// must equal `OUT`, and the kernel must fit inside the padded input.
pub struct WindowCheck<
    const INPUT: usize,
    const KERNEL: usize,
    const STRIDE: usize,
    const PAD: usize,
    const OUT: usize,
>;

impl<
        const INPUT: usize,
        const KERNEL: usize,
        const STRIDE: usize,
        const PAD: usize,
        const OUT: usize,
    > WindowCheck<INPUT, KERNEL, STRIDE, PAD, OUT>
{
    /// Evaluating this constant performs the check.
    pub const OK: () = {
        if KERNEL == 0 || STRIDE == 0 {
            concat_panic!("\n\nshape error: kernel and stride must be at least 1\n");
        }
        if KERNEL > INPUT + 2 * PAD {
            concat_panic!(
                "\n\nshape error: a kernel of ",
                KERNEL,
                " is larger than the input of ",
                INPUT,
                " padded by ",
                PAD,
                " on each side\n"
            );
        }
        let out = (INPUT + 2 * PAD - KERNEL) / STRIDE + 1;
        if out != OUT {
            concat_panic!(
                "\n\nshape error: a window of ",
                KERNEL,
                " with stride ",
                STRIDE,
                " and padding ",
                PAD,
                " over ",
                INPUT,
                " gives ",
                out,
                ", but the result type says ",
                OUT,
                "\n"
            );
        }
    };
}
