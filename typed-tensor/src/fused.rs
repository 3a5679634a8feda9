//! Fused elementwise expressions: the data a backend needs to run a group of
//! elementwise ops as one kernel (a short straight-line program over f32 registers),
//! the per-element f32 semantics every fused kernel shares with the unfused kernels,
//! and the signature of the native loops `#[model]` generates for the CPU.
//!
//! Bools live in registers as 1.0 / 0.0, so comparisons, `where` and casts between
//! f32 and bool fuse with arithmetic.

use crate::binary::BinaryKernel;
use crate::compare::CompareKernel;
use crate::op::{BinaryOp, CmpOp, UnaryOp};
use crate::unary::UnaryKernel;

/// One step of a fused expression; operands are indices of earlier steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExprStep {
    /// The element of input `k` (broadcast to the kernel's dims by its layout).
    Input(usize),
    /// The current element of output `k` (for in-place updates such as optimizers).
    Output(usize),
    /// A constant.
    Const(f32),
    /// A unary op.
    Unary(UnaryOp, usize),
    /// A binary op.
    Binary(BinaryOp, usize, usize),
    /// A comparison, as 1.0 or 0.0.
    Compare(CmpOp, usize, usize),
    /// `cond != 0 ? a : b`.
    Select(usize, usize, usize),
    /// A cast to bool: 1.0 where the operand is non-zero (NaN included), else 0.0.
    ToBool(usize),
}

/// A fused elementwise kernel: its steps and which step each output takes.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FusedExpr {
    /// The program, in order.
    pub steps: Vec<ExprStep>,
    /// For each output, the step whose value it stores.
    pub results: Vec<usize>,
    /// The number of inputs it reads.
    pub inputs: usize,
}

/// A product's epilogue in the form a device can compute inside the product (a linear
/// layer's): a bias added to the result, then at most one unary op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProductEpilogue {
    /// The epilogue's input added to the product's result (either order), if any.
    pub bias: Option<usize>,
    /// The unary op applied last (a ReLU), if any.
    pub activation: Option<UnaryOp>,
}

impl ProductEpilogue {
    /// `expr` (an epilogue, the product's result its `Output(0)`) as a bias and an
    /// activation, or `None` when it computes anything else.
    pub fn of(expr: &FusedExpr) -> Option<Self> {
        use ExprStep::{Binary, Input, Output, Unary};
        let [last] = expr.results[..] else {
            return None;
        };
        if last + 1 != expr.steps.len() {
            return None;
        }
        // The steps up to the activation: the result alone, or the result plus input 0.
        let (body, activation) = match expr.steps[..] {
            [.., Unary(op, a)] if a + 2 == expr.steps.len() => (&expr.steps[..=a], Some(op)),
            _ => (&expr.steps[..], None),
        };
        let bias = match *body {
            [Output(0)] if activation.is_some() => None,
            [Output(0), Input(0), Binary(BinaryOp::Add, x, y)]
            | [Input(0), Output(0), Binary(BinaryOp::Add, x, y)]
                if (x, y) == (0, 1) || (x, y) == (1, 0) =>
            {
                Some(0)
            }
            _ => return None,
        };
        (expr.inputs == usize::from(bias.is_some())).then_some(ProductEpilogue { bias, activation })
    }

    /// `v`, a result of the product, through the epilogue, `bias` the added value: the
    /// same f32 operations the unfused kernels run.
    #[inline(always)]
    pub fn apply(&self, v: f32, bias: f32) -> f32 {
        let v = if self.bias.is_some() {
            binary_f32(BinaryOp::Add, v, bias)
        } else {
            v
        };
        match self.activation {
            Some(op) => unary_f32(op, v),
            None => v,
        }
    }
}

/// Expressions up to this many steps are interpreted without copying operands.
const MAX_DIRECT_STEPS: usize = 64;

/// A native fused loop: `outs[k][j]` from `ins[..][j]` for every `j` (all slices have
/// the same length; outputs may be read first, for in-place updates).
pub type NativeFn = fn(ins: &[&[f32]], outs: &mut [&mut [f32]]);

/// A unary op on one f32: the op table's formula, as the unfused CPU kernels compute it.
#[inline(always)]
pub fn unary_f32(op: UnaryOp, v: f32) -> f32 {
    op.compute(v)
}

/// A binary op on two f32s: the op table's formula, as the unfused CPU kernels compute it.
#[inline(always)]
pub fn binary_f32(op: BinaryOp, x: f32, y: f32) -> f32 {
    op.compute(x, y)
}

/// A comparison of two f32s, as 1.0 or 0.0 (the op table's comparison).
#[inline(always)]
pub fn compare_f32(op: CmpOp, x: f32, y: f32) -> f32 {
    op.compute(x, y) as u8 as f32
}

/// `cond ? a : b` with a register bool.
#[inline(always)]
pub fn select_f32(cond: f32, a: f32, b: f32) -> f32 {
    if cond != 0.0 {
        a
    } else {
        b
    }
}

/// A register value cast to bool.
#[inline(always)]
pub fn to_bool_f32(v: f32) -> f32 {
    (v != 0.0) as u8 as f32
}

/// `dst[i] = f(a[i])`, monomorphised per op so that the loop vectorises.
#[inline(always)]
fn map1(dst: &mut [f32], a: &[f32], f: impl Fn(f32) -> f32) {
    crate::simd::wide(
        #[inline(always)]
        || {
            for (d, &x) in dst.iter_mut().zip(a) {
                *d = f(x);
            }
        },
    )
}

/// `dst[i] = f(a[i], b[i])`, monomorphised per op.
#[inline(always)]
fn map2(dst: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    crate::simd::wide(
        #[inline(always)]
        || {
            for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                *d = f(x, y);
            }
        },
    )
}

/// A unary op over a chunk: the `match` outside the loop.
fn unary_chunk(op: UnaryOp, dst: &mut [f32], a: &[f32]) {
    struct Chunk<'a> {
        dst: &'a mut [f32],
        a: &'a [f32],
    }
    impl UnaryKernel<f32> for Chunk<'_> {
        type Output = ();
        #[inline(always)]
        fn run(self, f: impl Fn(f32) -> f32 + Copy + Send + Sync) {
            map1(self.dst, self.a, f)
        }
    }
    op.dispatch(Chunk { dst, a })
}

/// A binary op over a chunk.
fn binary_chunk(op: BinaryOp, dst: &mut [f32], a: &[f32], b: &[f32]) {
    struct Chunk<'a> {
        dst: &'a mut [f32],
        a: &'a [f32],
        b: &'a [f32],
    }
    impl BinaryKernel<f32> for Chunk<'_> {
        type Output = ();
        #[inline(always)]
        fn run(self, f: impl Fn(f32, f32) -> f32 + Copy + Send + Sync) {
            map2(self.dst, self.a, self.b, f)
        }
    }
    op.dispatch(Chunk { dst, a, b })
}

/// A comparison over a chunk.
fn compare_chunk(op: CmpOp, dst: &mut [f32], a: &[f32], b: &[f32]) {
    struct Chunk<'a> {
        dst: &'a mut [f32],
        a: &'a [f32],
        b: &'a [f32],
    }
    impl CompareKernel<f32> for Chunk<'_> {
        type Output = ();
        #[inline(always)]
        fn run(self, f: impl Fn(f32, f32) -> bool + Copy + Send + Sync) {
            map2(self.dst, self.a, self.b, |x, y| f(x, y) as u8 as f32)
        }
    }
    op.dispatch(Chunk { dst, a, b })
}

impl FusedExpr {
    /// Interprets the expression over one chunk: `regs` is scratch of at least
    /// `steps.len() * len` floats; every slice of `ins` and `outs` has length `len`.
    /// Inputs are read in place and a result is computed straight into its output
    /// where that is safe, so the chunk is not copied around.
    pub fn eval_chunk(&self, ins: &[&[f32]], outs: &mut [&mut [f32]], regs: &mut [f32]) {
        let len = outs.first().map_or(0, |o| o.len());
        let n = self.steps.len();
        if n > MAX_DIRECT_STEPS {
            return self.eval_chunk_copying(ins, outs, regs);
        }
        // Where each step's values live: its scratch row, an input, or an output.
        let mut at: [*const f32; MAX_DIRECT_STEPS] = [std::ptr::null(); MAX_DIRECT_STEPS];
        let mut dst: [*mut f32; MAX_DIRECT_STEPS] = [std::ptr::null_mut(); MAX_DIRECT_STEPS];
        let last_output_read = self
            .steps
            .iter()
            .rposition(|s| matches!(s, ExprStep::Output(_)));
        let mut direct = [false; MAX_DIRECT_STEPS];
        for (k, &r) in self.results.iter().enumerate() {
            // Straight into output k only after every read of the old outputs, and once.
            let after_reads = last_output_read.is_none_or(|l| r > l);
            let computed = !matches!(self.steps[r], ExprStep::Input(_) | ExprStep::Output(_));
            if after_reads && computed && !direct[r] {
                direct[r] = true;
                dst[r] = outs[k].as_mut_ptr();
            }
        }
        for (s, step) in self.steps.iter().enumerate() {
            match *step {
                ExprStep::Input(k) => at[s] = ins[k].as_ptr(),
                _ if direct[s] => at[s] = dst[s],
                _ => {
                    dst[s] = regs[s * len..].as_mut_ptr();
                    at[s] = dst[s];
                }
            }
        }
        // SAFETY: every pointer covers `len` floats (inputs and outputs have `len`
        // elements, scratch rows are `len` apart within `regs`). A step writes only its
        // own row or its own output, and reads earlier steps' values, which live in
        // other rows, inputs (never written), or outputs whose result step came
        // earlier (a direct result is written after every `Output` read and only by
        // its step).
        unsafe {
            let reg = |i: usize| std::slice::from_raw_parts(at[i], len);
            for (s, step) in self.steps.iter().enumerate() {
                if let ExprStep::Input(_) = step {
                    continue;
                }
                let d = std::slice::from_raw_parts_mut(dst[s], len);
                match *step {
                    ExprStep::Input(_) => unreachable!("skipped above"),
                    ExprStep::Output(k) => d.copy_from_slice(&outs[k][..len]),
                    ExprStep::Const(c) => d.fill(c),
                    ExprStep::Unary(op, a) => unary_chunk(op, d, reg(a)),
                    ExprStep::Binary(op, a, b) => binary_chunk(op, d, reg(a), reg(b)),
                    ExprStep::Compare(op, a, b) => compare_chunk(op, d, reg(a), reg(b)),
                    ExprStep::Select(c, a, b) => {
                        for (((o, &c), &x), &y) in d.iter_mut().zip(reg(c)).zip(reg(a)).zip(reg(b))
                        {
                            *o = select_f32(c, x, y);
                        }
                    }
                    ExprStep::ToBool(a) => map1(d, reg(a), to_bool_f32),
                }
            }
            for (k, &r) in self.results.iter().enumerate() {
                if at[r] != outs[k].as_ptr() {
                    let v = reg(r);
                    outs[k].copy_from_slice(v);
                }
            }
        }
    }

    /// [`FusedExpr::eval_chunk`] for long expressions: every step in its scratch row.
    fn eval_chunk_copying(&self, ins: &[&[f32]], outs: &mut [&mut [f32]], regs: &mut [f32]) {
        let len = outs.first().map_or(0, |o| o.len());
        for (s, step) in self.steps.iter().enumerate() {
            let (done, rest) = regs.split_at_mut(s * len);
            let dst = &mut rest[..len];
            let reg = |i: usize| &done[i * len..(i + 1) * len];
            match *step {
                ExprStep::Input(k) => dst.copy_from_slice(&ins[k][..len]),
                ExprStep::Output(k) => dst.copy_from_slice(&outs[k][..len]),
                ExprStep::Const(c) => dst.fill(c),
                ExprStep::Unary(op, a) => unary_chunk(op, dst, reg(a)),
                ExprStep::Binary(op, a, b) => binary_chunk(op, dst, reg(a), reg(b)),
                ExprStep::Compare(op, a, b) => compare_chunk(op, dst, reg(a), reg(b)),
                ExprStep::Select(c, a, b) => {
                    for (((d, &c), &x), &y) in dst.iter_mut().zip(reg(c)).zip(reg(a)).zip(reg(b)) {
                        *d = select_f32(c, x, y);
                    }
                }
                ExprStep::ToBool(a) => map1(dst, reg(a), to_bool_f32),
            }
        }
        for (out, &r) in outs.iter_mut().zip(&self.results) {
            out.copy_from_slice(&regs[r * len..(r + 1) * len]);
        }
    }

    /// Evaluates the expression at one element (a reference for tests).
    pub fn eval_element(&self, ins: &[f32], outs: &[f32]) -> Vec<f32> {
        let mut regs: Vec<f32> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let v = match *step {
                ExprStep::Input(k) => ins[k],
                ExprStep::Output(k) => outs[k],
                ExprStep::Const(c) => c,
                ExprStep::Unary(op, a) => unary_f32(op, regs[a]),
                ExprStep::Binary(op, a, b) => binary_f32(op, regs[a], regs[b]),
                ExprStep::Compare(op, a, b) => compare_f32(op, regs[a], regs[b]),
                ExprStep::Select(c, a, b) => select_f32(regs[c], regs[a], regs[b]),
                ExprStep::ToBool(a) => to_bool_f32(regs[a]),
            };
            regs.push(v);
        }
        self.results.iter().map(|&r| regs[r]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epilogue(steps: Vec<ExprStep>, inputs: usize) -> FusedExpr {
        let last = steps.len() - 1;
        FusedExpr {
            steps,
            results: vec![last],
            inputs,
        }
    }

    #[test]
    fn a_bias_and_one_activation_are_a_product_epilogue() {
        use ExprStep::*;
        let of = |steps, inputs| ProductEpilogue::of(&epilogue(steps, inputs));
        let bias = |activation| ProductEpilogue {
            bias: Some(0),
            activation,
        };
        let add = |a, b| vec![a, b, Binary(BinaryOp::Add, 0, 1)];
        assert_eq!(of(add(Output(0), Input(0)), 1), Some(bias(None)));
        assert_eq!(of(add(Input(0), Output(0)), 1), Some(bias(None)));
        let mut relu = add(Output(0), Input(0));
        relu.push(Unary(UnaryOp::Relu, 2));
        assert_eq!(of(relu.clone(), 1), Some(bias(Some(UnaryOp::Relu))));
        let alone = ProductEpilogue {
            bias: None,
            activation: Some(UnaryOp::Tanh),
        };
        assert_eq!(of(vec![Output(0), Unary(UnaryOp::Tanh, 0)], 0), Some(alone));
        // Anything else is not one.
        let sub = vec![Output(0), Input(0), Binary(BinaryOp::Sub, 0, 1)];
        assert_eq!(of(sub, 1), None);
        assert_eq!(of(vec![Output(0)], 0), None);
        assert_eq!(of(add(Output(0), Output(0)), 0), None);
        assert_eq!(of(add(Input(0), Input(0)), 1), None);
        assert_eq!(of(add(Output(0), Input(1)), 2), None);
        assert_eq!(of(add(Output(0), Input(0)), 2), None);
        let mut twice = relu.clone();
        twice.push(Unary(UnaryOp::Relu, 3));
        assert_eq!(of(twice, 1), None);
        let mut earlier = relu.clone();
        earlier[3] = Unary(UnaryOp::Relu, 0);
        assert_eq!(of(earlier, 1), None);
        let two_results = FusedExpr {
            results: vec![2, 2],
            ..epilogue(add(Output(0), Input(0)), 1)
        };
        assert_eq!(ProductEpilogue::of(&two_results), None);
        // It computes what the expression does, NaN included.
        for v in [-2.0f32, 0.0, 3.5, f32::NAN, f32::INFINITY] {
            let want = epilogue(relu.clone(), 1).eval_element(&[0.25], &[v])[0];
            let got = bias(Some(UnaryOp::Relu)).apply(v, 0.25);
            assert_eq!(got.to_bits(), want.to_bits(), "{v}");
        }
    }

    #[test]
    fn a_bias_is_one_row_broadcast() -> crate::Result<()> {
        use crate::{Dims, Layout};
        let d = |v: &[usize]| Dims::new(v);
        let row = Layout::from_parts(d(&[4, 8])?, &[0, 1], 3);
        assert!(row.is_broadcast_row(&[4, 8]));
        assert!(!row.is_broadcast_row(&[4, 9]));
        assert!(!Layout::contiguous(d(&[4, 8])?).is_broadcast_row(&[4, 8]));
        let column = Layout::from_parts(d(&[4, 8])?, &[1, 0], 0);
        assert!(!column.is_broadcast_row(&[4, 8]));
        let batched = Layout::from_parts(d(&[2, 4, 8])?, &[0, 0, 1], 0);
        assert!(batched.is_broadcast_row(&[2, 4, 8]));
        Ok(())
    }

    #[test]
    fn chunk_interpreter_matches_elements() {
        // out0 = relu(x*1.5+0.5) * sigmoid(x); out1 = out1_old + (x > 0)
        let e = FusedExpr {
            steps: vec![
                ExprStep::Input(0),
                ExprStep::Const(1.5),
                ExprStep::Binary(BinaryOp::Mul, 0, 1),
                ExprStep::Const(0.5),
                ExprStep::Binary(BinaryOp::Add, 2, 3),
                ExprStep::Unary(UnaryOp::Relu, 4),
                ExprStep::Unary(UnaryOp::Sigmoid, 0),
                ExprStep::Binary(BinaryOp::Mul, 5, 6),
                ExprStep::Output(1),
                ExprStep::Const(0.0),
                ExprStep::Compare(CmpOp::Gt, 0, 9),
                ExprStep::Binary(BinaryOp::Add, 8, 10),
            ],
            results: vec![7, 11],
            inputs: 1,
        };
        let x = [-2.0f32, -0.1, 0.0, 0.3, 4.0];
        let mut o0 = [0f32; 5];
        let mut o1 = [1f32, 2., 3., 4., 5.];
        let old = o1;
        let mut regs = vec![0f32; e.steps.len() * 5];
        e.eval_chunk(&[&x], &mut [&mut o0, &mut o1], &mut regs);
        for j in 0..5 {
            let want = e.eval_element(&[x[j]], &[0.0, old[j]]);
            assert_eq!([o0[j], o1[j]], [want[0], want[1]]);
        }
        assert_eq!(o1, [1., 2., 3., 5., 6.]);
    }
}
