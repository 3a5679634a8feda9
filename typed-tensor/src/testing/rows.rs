//! Row passes for the backends' row-pass tests: the one phase builder and the layer
//! norm pass both the CPU's and the GPUs' tests run, so that each backend is held to
//! the same pass.

use crate::fused::{ExprStep, FusedExpr};
use crate::op::{BinaryOp, ReduceOp};
use crate::rows::{RowPass, RowPhase, RowRead, RowTarget};

/// A phase computing `steps` (its result the last step) over `inputs` into `target`,
/// over whole rows or (`per_row`) one value per row.
pub fn map(
    steps: Vec<ExprStep>,
    inputs: Vec<RowRead>,
    target: RowTarget,
    per_row: bool,
) -> RowPhase {
    let n = steps.len();
    RowPhase::Map {
        expr: FusedExpr {
            steps,
            results: vec![n - 1],
            inputs: inputs.len(),
        },
        native: None,
        inputs,
        target,
        per_row,
    }
}

/// A layer norm's statistics and `(x − mean) · w` over `rows` rows of `width`: inputs
/// `x` and `w` (whole rows), outputs the means, the rows' sums of squared deviations
/// and the result.
pub fn layer_norm(rows: usize, width: usize) -> RowPass {
    use ExprStep::*;
    let mean = RowRead::Output {
        k: 0,
        broadcast: true,
    };
    RowPass {
        rows,
        width,
        phases: vec![
            RowPhase::Reduce {
                op: ReduceOp::Sum,
                input: RowRead::Input(0),
                out: 0,
            },
            map(
                vec![
                    Output(0),
                    Const(1.0 / width as f32),
                    Binary(BinaryOp::Mul, 0, 1),
                ],
                vec![],
                RowTarget::Output(0),
                true,
            ),
            map(
                vec![
                    Input(0),
                    Input(1),
                    Binary(BinaryOp::Sub, 0, 1),
                    Binary(BinaryOp::Mul, 2, 2),
                ],
                vec![RowRead::Input(0), mean],
                RowTarget::Scratch,
                false,
            ),
            RowPhase::Reduce {
                op: ReduceOp::Sum,
                input: RowRead::Scratch,
                out: 1,
            },
            map(
                vec![
                    Input(0),
                    Input(1),
                    Input(2),
                    Binary(BinaryOp::Sub, 0, 1),
                    Binary(BinaryOp::Mul, 3, 2),
                ],
                vec![RowRead::Input(0), mean, RowRead::Input(1)],
                RowTarget::Output(2),
                false,
            ),
        ],
        whole_rows: vec![false, false, true],
    }
}
