//! Guards: the input checks of composites and layers, written once. A composite that
//! needs more of its inputs than its primitives' rules check (cross-entropy's labels
//! must have one row per logit row, a layer's input must have its width) checks them
//! through [`Builder::guard`](crate::Builder::guard). On numbers the check runs then
//! and there; on symbolic dims it runs too (an error when provably wrong), and a graph
//! keeps every guard that depends on a size only the run time knows, so a plan runs it
//! again when it binds its inputs: the planned path refuses what the op-by-op path
//! refuses, with the same message.

use crate::error::{Error, Result};
use crate::nn::LayerSpec;
use crate::op::{broadcast_dims, fmt_dims, product, BinaryOp, SymDim, TensorMeta};

/// One input check of a composite op or a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Guard {
    /// A layer's input (`LayerSpec::check_input`): one input, the layer's argument.
    LayerInput(LayerSpec),
    /// Cross-entropy's inputs: logits `[N, C]` and labels `[N]`.
    CrossEntropy,
    /// Batch statistics of `[N, C, H, W]` in training need more than one value per
    /// channel (one value has no variance; PyTorch refuses it too).
    BatchNormTraining,
    /// Ids `[.., T]` whose positions `0..T` a position table of `table` rows embeds.
    Positions {
        /// The table's rows.
        table: usize,
    },
    /// A convolution's input `[N, C, H, W]` against its weight `[O, C/groups, kh, kw]`.
    Conv2d {
        /// Channel groups.
        groups: usize,
    },
    /// Two operands of one shape (an elementwise loss such as `mse`; no broadcasting).
    EqualShapes {
        /// The composite's name.
        op: SameShapeOp,
    },
    /// Scores `[.., T, T]` whose last two axes are queries and keys of one sequence
    /// (the causal mask).
    SquareScores,
    /// Float rows `[.., D]` scored against an embedding table `[V, D]` (a tied output head).
    TiedHead {
        /// The table's rows.
        vocab: usize,
        /// The table's width.
        features: usize,
    },
    /// The operands of an elementwise op a user wrote (`a - b`, `a.sub(&b)`):
    /// broadcasting may expand one of them, never both (`[B, 1] - [B]` would be the
    /// outer product `[B, B]`), and an operand that lost an axis must not line up with
    /// another axis of the same size (`x - x.mean::<1>()`). See [`check_broadcast`].
    Broadcast {
        /// The elementwise op.
        op: BinaryOp,
    },
    /// A reshape whose leading size is solved from the element count, against its
    /// result: rows may be split or merged whole, never cut across (`[2, 10]` into
    /// `[5, 4]`); `regroup` is the reshape that means to. Inputs: the reshaped tensor
    /// and the result.
    WholeRows,
}

/// How surely one operand of a broadcast is expanded (has size 1, or no axis, where the
/// other is larger).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Expanded {
    No,
    /// Only if a `Dyn` turns out to be 1, or larger than 1.
    Maybe,
    Yes,
}

/// Whether `mine` (an operand's size on one axis, `None` where it has no such axis)
/// is expanded to `other`'s size there.
fn expanded_on<D: SymDim>(mine: Option<&D>, other: Option<&D>) -> Expanded {
    let Some(other) = other else {
        return Expanded::No;
    };
    let larger = match other.as_lit() {
        Some(n) => {
            if n > 1 {
                Expanded::Yes
            } else {
                return Expanded::No;
            }
        }
        None if other.is_runtime() => Expanded::Maybe,
        // A size parameter: the definition must hold for sizes above 1.
        None => Expanded::Yes,
    };
    match mine {
        None => larger,
        Some(m) => match m.as_lit() {
            Some(1) => larger,
            Some(_) => Expanded::No,
            None if m.is_runtime() => larger.min(Expanded::Maybe),
            None => Expanded::No,
        },
    }
}

/// Whether operands of different ranks line up sizes that only the run time can tell
/// apart, so that [`check_broadcast`]'s rule for an axis lost to a reduction may
/// refuse them on numbers.
fn lines_up_open<D: SymDim>(a: &[D], b: &[D]) -> bool {
    a.len() != b.len()
        && a.iter().rev().zip(b.iter().rev()).any(|(x, y)| {
            (x.is_runtime() || y.is_runtime())
                && x.as_lit() != Some(1)
                && y.as_lit() != Some(1)
                && x.matches(y) != Some(true)
        })
}

/// How surely each operand of `a op b` is expanded by broadcasting.
fn expansions<D: SymDim>(a: &[D], b: &[D]) -> (Expanded, Expanded) {
    let n = a.len().max(b.len());
    fn at<D>(d: &[D], n: usize, i: usize) -> Option<&D> {
        (i + d.len()).checked_sub(n).map(|j| &d[j])
    }
    (0..n).fold((Expanded::No, Expanded::No), |(ea, eb), i| {
        let (x, y) = (at(a, n, i), at(b, n, i));
        (ea.max(expanded_on(x, y)), eb.max(expanded_on(y, x)))
    })
}

/// The rule of [`Guard::WholeRows`]: `from` reshaped into `to`, whose leading size was
/// solved from the element count, keeps rows whole: each row of `to` lies within one
/// row of `from` (`[B, T, D]` into `[B·T, D]`) or is made of whole rows of it
/// (`[B·T, D]` into `[B, T·D]`). Otherwise the reshape regroups rows (`[2, 10]` into
/// `[5, 4]`: a row of the result takes the end of one input row and the start of the
/// next), which `regroup` writes on purpose. On symbolic sizes, per-row counts that
/// are not numbers pass; the kept guard runs again on numbers.
pub fn check_whole_rows<D: SymDim>(from: &[D], to: &[D]) -> Result<()> {
    if from.is_empty() || to.is_empty() {
        return Ok(());
    }
    let (row_in, row_out) = (product(&from[1..]), product(&to[1..]));
    let (Some(n), Some(m)) = (row_in.as_lit(), row_out.as_lit()) else {
        return Ok(());
    };
    if n == 0 || m == 0 || n % m == 0 || m % n == 0 {
        return Ok(());
    }
    Err(Error::shape(
        "reshape",
        format!(
            "reshaping {} into {} regroups rows: the result's rows of {m} elements cut across the input's rows of {n} (neither count divides the other); keep rows whole (a count per row that divides {n} or is a multiple of it), or write `.regroup::<..>()` if regrouping rows is meant",
            fmt_dims(from),
            fmt_dims(to),
        ),
    ))
}

/// `short`'s sizes placed on the axes of `long` they equal, in order, with 1 on the
/// others: the shape an operand that lost an axis to a reduction has when it keeps it.
fn kept_axes<D: SymDim>(long: &[D], short: &[D]) -> Option<Vec<D>> {
    let mut out = Vec::with_capacity(long.len());
    let mut rest = short.iter().peekable();
    for l in long {
        match rest.peek() {
            Some(s) if s.matches(l) == Some(true) || s.as_lit() == Some(1) => {
                out.push((*s).clone());
                rest.next();
            }
            _ => out.push(D::lit(1)),
        }
    }
    rest.peek().is_none().then_some(out)
}

/// The rule of [`Guard::Broadcast`], the one home of what a user's elementwise op may
/// broadcast: one operand may be expanded (a bias `[B, N] + [N]`, a mask
/// `[B, T, T] + [T, T]`, a row statistic `[B, N] - [B, 1]`, a number), never both
/// (`[B, 1] - [B]` is `[B, B]`: one size on two axes, an outer product nobody wrote);
/// and an operand of lower rank whose size lines up with an axis of another size while
/// it is the other operand's size on another axis (`[B, N] - [B]`, where `[B]` is a
/// mean over axis 1) is refused, saying to keep the reduced axis. On symbolic sizes a
/// `Dyn` passes where only its value can tell; the kept guard runs again on numbers.
pub fn check_broadcast<D: SymDim>(op: BinaryOp, a: &[D], b: &[D]) -> Result<()> {
    let name = op.name();
    if a.len() != b.len() {
        let (long, short) = if a.len() > b.len() { (a, b) } else { (b, a) };
        let off = long.len() - short.len();
        for (j, s) in short.iter().enumerate() {
            let i = j + off;
            let l = &long[i];
            if s.as_lit() == Some(1) || l.as_lit() == Some(1) || s.matches(l) == Some(true) {
                continue;
            }
            let elsewhere = (0..long.len()).find(|&k| k != i && long[k].matches(s) == Some(true));
            if let Some(k) = elsewhere {
                let fix = kept_axes(long, short)
                    .map(|d| format!("; reshape it to {} (`.reshape::<..>()`)", fmt_dims(&d)))
                    .unwrap_or_default();
                return Err(Error::shape(
                    name,
                    format!(
                        "{} lines up its axis {j} ({s}) with axis {i} of {}, but {s} is axis {k} of {}: an axis removed by a reduction must be kept as size 1 so that the axes line up{fix}",
                        fmt_dims(short),
                        fmt_dims(long),
                        fmt_dims(long),
                    ),
                ));
            }
        }
    }
    if expansions(a, b) == (Expanded::Yes, Expanded::Yes) {
        let out = broadcast_dims(name, a, b)
            .map(|d| format!(", to {}", fmt_dims(&d)))
            .unwrap_or_default();
        return Err(Error::shape(
            name,
            format!(
                "broadcasting {} with {} expands both operands{out}, an outer product: give them one shape (`.reshape::<..>()` adds the size-1 axis where it belongs), or, if the outer product is meant, write it with `.broadcast_to::<..>()` on one operand",
                fmt_dims(a),
                fmt_dims(b)
            ),
        ));
    }
    Ok(())
}

/// The composites whose two operands must have one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameShapeOp {
    /// Mean squared error.
    Mse,
}

impl SameShapeOp {
    /// The composite's name, as errors and plan text show it.
    pub fn name(self) -> &'static str {
        match self {
            SameShapeOp::Mse => "mse",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [SameShapeOp::Mse].into_iter().find(|o| o.name() == s)
    }
}

impl Guard {
    /// The guard's name in plan text.
    pub fn name(&self) -> &'static str {
        match self {
            Guard::LayerInput(_) => "layer",
            Guard::CrossEntropy => "cross_entropy",
            Guard::Conv2d { .. } => "conv2d",
            Guard::BatchNormTraining => "batch_norm_training",
            Guard::Positions { .. } => "positions",
            Guard::EqualShapes { op } => op.name(),
            Guard::SquareScores => "causal_mask",
            Guard::TiedHead { .. } => "attend",
            Guard::Broadcast { op } => op.name(),
            Guard::WholeRows => "reshape",
        }
    }

    /// Whether the check's outcome depends on a size the build does not know as a
    /// number: a `Dyn`, or (for the checks that compare a size with a number) a size
    /// parameter. A graph keeps such a guard and runs it again on the real sizes.
    pub fn is_open<D: SymDim>(&self, inputs: &[&TensorMeta<D>]) -> bool {
        let numeric = |d: &D| d.as_lit().is_none();
        match self {
            Guard::Positions { .. } => inputs
                .first()
                .and_then(|m| m.dims.last())
                .is_some_and(numeric),
            Guard::BatchNormTraining => inputs.first().is_some_and(|m| m.dims.iter().any(numeric)),
            // Only where both operands may be expanded: a bias add over a `Dyn` batch
            // keeps nothing.
            Guard::Broadcast { .. } => match inputs {
                [a, b] => {
                    let (ea, eb) = expansions(&a.dims, &b.dims);
                    ea.min(eb) == Expanded::Maybe || lines_up_open(&a.dims, &b.dims)
                }
                _ => false,
            },
            _ => inputs.iter().any(|m| m.dims.iter().any(|d| d.is_runtime())),
        }
    }

    /// Runs the check: an error when the inputs provably do not fit (on symbolic dims,
    /// a size only the run time knows passes).
    pub fn check<D: SymDim>(&self, inputs: &[&TensorMeta<D>]) -> Result<()> {
        let want = match self {
            Guard::LayerInput(_)
            | Guard::BatchNormTraining
            | Guard::Positions { .. }
            | Guard::SquareScores
            | Guard::TiedHead { .. } => 1,
            Guard::CrossEntropy
            | Guard::Conv2d { .. }
            | Guard::EqualShapes { .. }
            | Guard::Broadcast { .. }
            | Guard::WholeRows => 2,
        };
        if inputs.len() != want {
            return Err(Error::invalid(
                self.name(),
                format!("the check takes {want} inputs, got {}", inputs.len()),
            ));
        }
        match self {
            Guard::LayerInput(spec) => {
                spec.check_input(&inputs[0].dims)
                    .map_err(|m| Error::shape("layer", m))?;
                let dtype = inputs[0].dtype;
                let ids = matches!(spec, LayerSpec::Embedding { .. });
                if ids && !dtype.is_int() {
                    return Err(Error::dtype(
                        "layer",
                        format!("{spec} takes integer ids (i32 or u32), got {dtype}"),
                    ));
                }
                if !ids && !dtype.is_float() {
                    return Err(Error::dtype(
                        "layer",
                        format!("{spec} takes a float tensor, got {dtype}"),
                    ));
                }
                Ok(())
            }
            Guard::CrossEntropy => {
                let (ld, yd) = (&inputs[0].dims, &inputs[1].dims);
                if ld.len() != 2 || yd.len() != 1 || ld[0].matches(&yd[0]) == Some(false) {
                    return Err(Error::shape(
                        "cross_entropy",
                        format!(
                            "logits {} need labels [{}], got {}",
                            fmt_dims(ld),
                            ld.first().map_or("N".into(), |d| d.to_string()),
                            fmt_dims(yd)
                        ),
                    ));
                }
                let (logits, labels) = (inputs[0].dtype, inputs[1].dtype);
                if !logits.is_float() || !labels.is_int() {
                    return Err(Error::dtype(
                        "cross_entropy",
                        format!("takes float logits and integer class ids (i32 or u32) as labels, got {logits} and {labels}"),
                    ));
                }
                Ok(())
            }
            Guard::BatchNormTraining => {
                let d = &inputs[0].dims;
                let per_channel = d
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != 1)
                    .fold(D::lit(1), |n, (_, x)| n.mul(x));
                if per_channel.as_lit().is_some_and(|n| n <= 1) {
                    return Err(Error::shape(
                        "batch_norm",
                        format!(
                            "training needs more than one value per channel, got input {}",
                            fmt_dims(d)
                        ),
                    ));
                }
                Ok(())
            }
            Guard::Positions { table } => {
                let d = &inputs[0].dims;
                // The count of positions is read from token ids, not from what they
                // became: embeddings [.., T, D] would read D as the length.
                if !inputs[0].dtype.is_int() {
                    return Err(Error::dtype(
                        "positions",
                        format!(
                            "positions are read from the token ids [.., T] (integers), but this is a {} tensor {}: pass the ids the token embedding reads, not the embeddings",
                            inputs[0].dtype,
                            fmt_dims(d)
                        ),
                    ));
                }
                let Some(t) = d.last() else {
                    return Err(Error::shape(
                        "positions",
                        "scalar ids have no positions".to_string(),
                    ));
                };
                if t.as_lit().is_some_and(|t| t > *table) {
                    return Err(Error::shape(
                        "positions",
                        format!(
                            "ids {} hold {t} positions but the position table has {table} rows",
                            fmt_dims(d)
                        ),
                    ));
                }
                Ok(())
            }
            Guard::Conv2d { groups } => {
                let (xd, wd) = (&inputs[0].dims, &inputs[1].dims);
                if xd.len() != 4 || wd.len() != 4 || *groups == 0 {
                    return Err(Error::shape(
                        "conv2d",
                        format!(
                            "expects x [N, C, H, W] and w [O, C/g, kh, kw], got {} and {}",
                            fmt_dims(xd),
                            fmt_dims(wd)
                        ),
                    ));
                }
                let cin = wd[1].mul(&D::lit(*groups));
                if xd[1].matches(&cin) == Some(false) {
                    return Err(Error::shape(
                        "conv2d",
                        format!(
                            "the input has {} channels but the weight {} expects {} × {groups} groups",
                            xd[1],
                            fmt_dims(wd),
                            wd[1]
                        ),
                    ));
                }
                Ok(())
            }
            Guard::EqualShapes { op } => {
                let (a, b) = (&inputs[0].dims, &inputs[1].dims);
                let differ =
                    a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.matches(y) == Some(false));
                if differ {
                    return Err(Error::shape(
                        op.name(),
                        format!(
                            "the operands have shapes {} and {}; they must be equal (broadcast one explicitly if that is meant)",
                            fmt_dims(a),
                            fmt_dims(b)
                        ),
                    ));
                }
                Ok(())
            }
            Guard::SquareScores => {
                let d = &inputs[0].dims;
                let r = d.len();
                if r < 2 || d[r - 2].matches(&d[r - 1]) == Some(false) {
                    return Err(Error::shape(
                        "causal_mask",
                        format!(
                            "masks scores [.., T, T] (queries × keys of one sequence), got {}",
                            fmt_dims(d)
                        ),
                    ));
                }
                let dtype = inputs[0].dtype;
                if !dtype.is_float() {
                    return Err(Error::dtype(
                        "causal_mask",
                        format!("masks float scores, got {dtype}"),
                    ));
                }
                Ok(())
            }
            Guard::Broadcast { op } => check_broadcast(*op, &inputs[0].dims, &inputs[1].dims),
            Guard::WholeRows => check_whole_rows(&inputs[0].dims, &inputs[1].dims),
            Guard::TiedHead { vocab, features } => {
                let (d, dtype) = (&inputs[0].dims, inputs[0].dtype);
                if !dtype.is_float() {
                    return Err(Error::dtype(
                        "attend",
                        format!("scores float rows against the table, got {dtype}"),
                    ));
                }
                let width = D::lit(*features);
                if d.last().is_none_or(|w| w.matches(&width) == Some(false)) {
                    return Err(Error::shape(
                        "attend",
                        format!(
                            "scores rows of {features} features against its table [{vocab}, {features}], got {}",
                            fmt_dims(d)
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The guard as one line of plan text (`parse` reads it back).
    pub fn to_text(&self) -> String {
        match self {
            Guard::LayerInput(spec) => format!("layer {spec}"),
            Guard::CrossEntropy => "cross_entropy".into(),
            Guard::Conv2d { groups } => format!("conv2d {groups}"),
            Guard::BatchNormTraining => "batch_norm_training".into(),
            Guard::Positions { table } => format!("positions {table}"),
            Guard::EqualShapes { op } => format!("same_shape {}", op.name()),
            Guard::SquareScores => "square_scores".into(),
            Guard::TiedHead { vocab, features } => format!("tied_head {vocab} {features}"),
            Guard::Broadcast { op } => format!("broadcast {}", op.name()),
            Guard::WholeRows => "whole_rows".into(),
        }
    }

    /// Reads `to_text`'s form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || Error::Format(format!("`{s}` is not a guard"));
        let (head, rest) = s.split_once(' ').unwrap_or((s, ""));
        match head {
            "layer" => LayerSpec::parse(rest)
                .map(Guard::LayerInput)
                .map_err(|_| bad()),
            "cross_entropy" if rest.is_empty() => Ok(Guard::CrossEntropy),
            "batch_norm_training" if rest.is_empty() => Ok(Guard::BatchNormTraining),
            "positions" => Ok(Guard::Positions {
                table: rest.parse().map_err(|_| bad())?,
            }),
            "conv2d" => Ok(Guard::Conv2d {
                groups: rest.parse().map_err(|_| bad())?,
            }),
            "same_shape" => Ok(Guard::EqualShapes {
                op: SameShapeOp::parse(rest).ok_or_else(bad)?,
            }),
            "square_scores" if rest.is_empty() => Ok(Guard::SquareScores),
            "whole_rows" if rest.is_empty() => Ok(Guard::WholeRows),
            "broadcast" => BinaryOp::ALL
                .iter()
                .find(|o| o.name() == rest)
                .map(|&op| Guard::Broadcast { op })
                .ok_or_else(bad),
            "tied_head" => {
                let (v, f) = rest.split_once(' ').ok_or_else(bad)?;
                Ok(Guard::TiedHead {
                    vocab: v.parse().map_err(|_| bad())?,
                    features: f.parse().map_err(|_| bad())?,
                })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn text_round_trips() {
        for g in [
            Guard::CrossEntropy,
            Guard::BatchNormTraining,
            Guard::Conv2d { groups: 3 },
            Guard::Positions { table: 256 },
            Guard::EqualShapes {
                op: SameShapeOp::Mse,
            },
            Guard::SquareScores,
            Guard::TiedHead {
                vocab: 65,
                features: 128,
            },
            Guard::LayerInput(LayerSpec::Linear {
                inputs: 784,
                outputs: 10,
            }),
            Guard::LayerInput(LayerSpec::Conv2d {
                inputs: 4,
                outputs: 8,
                kernel: 3,
                stride: 2,
                padding: 1,
                groups: 2,
            }),
            Guard::LayerInput(LayerSpec::Flatten),
            Guard::Broadcast { op: BinaryOp::Sub },
            Guard::Broadcast { op: BinaryOp::Max },
            Guard::WholeRows,
        ] {
            assert_eq!(Guard::parse(&g.to_text()).unwrap(), g);
        }
        assert!(Guard::parse("layer Linear<3>").is_err());
        assert!(Guard::parse("sideways").is_err());
    }

    fn f32(d: &[usize]) -> TensorMeta {
        TensorMeta::new(d.to_vec(), DType::F32)
    }

    fn sub(a: &[usize], b: &[usize]) -> std::result::Result<(), String> {
        Guard::Broadcast { op: BinaryOp::Sub }
            .check(&[&f32(a), &f32(b)])
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_broadcast_expands_one_operand_at_most() {
        // Bias adds, masks, row statistics, numbers and rank promotion.
        for (a, b) in [
            (&[3, 4][..], &[4][..]),
            (&[2, 3, 3], &[3, 3]),
            (&[3, 4], &[3, 1]),
            (&[], &[3, 4]),
            (&[1, 4], &[4]),
            (&[3, 4], &[3, 4]),
            (&[1, 1], &[1]),
            // Numbers cannot tell a dropped axis on a square batch.
            (&[4, 4], &[4]),
        ] {
            sub(a, b).unwrap_or_else(|e| panic!("{a:?} - {b:?}: {e}"));
            sub(b, a).unwrap_or_else(|e| panic!("{b:?} - {a:?}: {e}"));
        }
        for (a, b, out) in [
            (&[3, 1][..], &[3][..], "[3, 3]"),
            (&[3, 1], &[1, 4], "[3, 4]"),
            (&[2, 1, 5], &[3, 1], "[2, 3, 5]"),
        ] {
            let e = sub(a, b).unwrap_err();
            assert!(
                e.contains(&format!(
                    "expands both operands, to {out}, an outer product"
                )) && e.contains("`.broadcast_to::<..>()`"),
                "{e}"
            );
        }
        assert_eq!(
            sub(&[3, 1], &[3]).unwrap_err(),
            "shape mismatch in `sub`: broadcasting [3, 1] with [3] expands both operands, to [3, 3], an outer product: give them one shape (`.reshape::<..>()` adds the size-1 axis where it belongs), or, if the outer product is meant, write it with `.broadcast_to::<..>()` on one operand"
        );
    }

    #[test]
    fn an_operand_that_lost_an_axis_is_told_to_keep_it() {
        let e = sub(&[3, 4], &[3]).unwrap_err();
        assert_eq!(
            e,
            "shape mismatch in `sub`: [3] lines up its axis 0 (3) with axis 1 of [3, 4], but 3 is axis 0 of [3, 4]: an axis removed by a reduction must be kept as size 1 so that the axes line up; reshape it to [3, 1] (`.reshape::<..>()`)"
        );
        let e = sub(&[2, 5], &[2, 3, 5]).unwrap_err();
        assert!(e.contains("reshape it to [2, 1, 5]"), "{e}");
    }

    #[test]
    fn a_reshape_keeps_rows_whole() {
        let rows = |a: &[usize], b: &[usize]| {
            Guard::WholeRows
                .check(&[&f32(a), &f32(b)])
                .map_err(|e| e.to_string())
        };
        for (a, b) in [
            (&[2, 12][..], &[6, 4][..]),
            (&[6, 4], &[2, 12]),
            (&[2, 3, 4], &[6, 4]),
            (&[5, 4], &[5, 2, 2]),
        ] {
            rows(a, b).unwrap_or_else(|e| panic!("{a:?} into {b:?}: {e}"));
        }
        assert_eq!(
            rows(&[2, 10], &[5, 4]).unwrap_err(),
            "shape mismatch in `reshape`: reshaping [2, 10] into [5, 4] regroups rows: the result's rows of 4 elements cut across the input's rows of 10 (neither count divides the other); keep rows whole (a count per row that divides 10 or is a multiple of it), or write `.regroup::<..>()` if regrouping rows is meant"
        );
    }

    #[test]
    fn a_kept_row_must_divide_into_the_known_sizes() {
        let e = crate::op::check_kept_rows(&[2usize, 10], &[Some(2), None, Some(4)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "shape mismatch in `reshape`: cannot reshape [2, 10] into [2, ?, 4]: it keeps the leading [2], and the 10 elements under each of those are not a multiple of 4, so no size fits the open one"
        );
        crate::op::check_kept_rows(&[2usize, 12], &[Some(2), None, Some(4)]).unwrap();
        crate::op::check_kept_rows(&[2usize, 10], &[None, Some(4)]).unwrap();
    }

    #[test]
    fn cross_entropy_needs_a_label_per_row() {
        let logits = TensorMeta::new(vec![3usize, 10], DType::F32);
        let labels = TensorMeta::new(vec![5usize], DType::I32);
        let e = Guard::CrossEntropy.check(&[&logits, &labels]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "shape mismatch in `cross_entropy`: logits [3, 10] need labels [3], got [5]"
        );
    }
}
