//! Random graphs of elementwise ops (with broadcasting, comparisons and `where`) and
//! reductions, built on any `Builder`: shared by kiln-fusion's planner tests and
//! kiln-dynamic's lazy-vs-eager tests.

use kiln_tensor::{BinaryOp, Builder, BuilderExt, CmpOp, ReduceOp, Result, UnaryOp};
use proptest::prelude::*;

/// One step of a random graph; operands index earlier values (modulo their count).
#[derive(Clone, Debug)]
pub enum Step {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Where(CmpOp, usize, usize, usize),
    Reduce(ReduceOp, usize, usize),
}

pub fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(vec![
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Sin,
        UnaryOp::Exp,
    ]);
    let binary = prop::sample::select(vec![
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Max,
        BinaryOp::Min,
    ]);
    let cmp = prop::sample::select(vec![CmpOp::Lt, CmpOp::Ge, CmpOp::Eq]);
    let reduce = prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]);
    prop_oneof![
        3 => (unary, any::<usize>()).prop_map(|(o, a)| Step::Unary(o, a)),
        4 => (binary, any::<usize>(), any::<usize>()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        1 => (cmp, any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(o, a, b, c)| Step::Where(o, a, b, c)),
        2 => (reduce, any::<usize>(), 0..2usize).prop_map(|(o, a, ax)| Step::Reduce(o, a, ax)),
    ]
}

/// Builds the steps on any builder from `inputs`; returns every value.
pub fn build<Bd: Builder>(
    b: &mut Bd,
    inputs: Vec<Bd::Value>,
    steps: &[Step],
) -> Result<Vec<Bd::Value>>
where
    Bd::Value: Clone,
{
    let mut vals = inputs;
    for s in steps {
        let n = vals.len();
        let v = match *s {
            Step::Unary(op, a) => b.unary(op, &vals[a % n])?,
            Step::Binary(op, a, c) => b.binary(op, &vals[a % n], &vals[c % n])?,
            Step::Where(op, a, c, d) => {
                let cond = b.compare(op, &vals[a % n], &vals[c % n])?;
                b.select(&cond, &vals[c % n], &vals[d % n])?
            }
            // Keepdim, so the result still broadcasts against the others.
            Step::Reduce(op, a, axis) => b.reduce(op, &vals[a % n], &[axis], true)?,
        };
        vals.push(v);
    }
    Ok(vals)
}
