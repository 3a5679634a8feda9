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
use crate::op::{fmt_dims, SymDim, TensorMeta};

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
            Guard::CrossEntropy | Guard::Conv2d { .. } | Guard::EqualShapes { .. } => 2,
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
        ] {
            assert_eq!(Guard::parse(&g.to_text()).unwrap(), g);
        }
        assert!(Guard::parse("layer Linear<3>").is_err());
        assert!(Guard::parse("sideways").is_err());
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
