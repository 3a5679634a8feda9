//! Mixed precision: a model's precision policy, and the one rule of which ops compute
//! in a narrower float than their inputs under it. The macro applies the rule while it
//! builds a method's graph (`#[model(precision = bf16)] type GptBf16 = Gpt<..>;`), so
//! the casts are nodes of the plan, fused into the kernels around them, and the
//! backward pass gets its own from the casts' gradient rule.
//!
//! Under `bf16`, parameters, optimizer state, gradients as the optimizer sees them, and
//! everything but the matrix products stay f32: softmax, normalisation statistics and
//! losses are accumulated in f32, as the products' results are cast back to f32 right
//! away. The products (the layers' and attention's) take bf16 operands; fused attention
//! takes bf16 queries, keys and values and keeps its softmax statistics in f32 inside
//! the kernel, as the unfused plan keeps its softmax in f32.
//!
//! `f16` narrows the same ops to f16, whose range ends at 65504 and whose smallest
//! subnormal is 6e-8: a training step under it is loss-scaled
//! ([`Precision::loss_scaled`]): the backward pass starts from the model's loss scale
//! instead of 1 and each parameter's gradient is divided by it before it leaves the
//! step ([`crate::nn::LossScale`] keeps the scale and the rule that moves it).

use crate::builder::Builder;
use crate::op::Op;
use crate::{DType, Error, Result, SymDim};

/// What follows a weight's name in the name of its int8 scales (`fc1.weight_scale`).
pub const INT8_SCALE_SUFFIX: &str = "_scale";

/// A row of weights as int8 with its scale, the int8 policy's one rounding rule: the
/// scale is the row's largest magnitude over 127 (0 for a row of zeros) and each value
/// `round(v / scale)`, so values lie in −127..=127 and `q · scale` is within half a
/// scale of `v`. Finite values only: the caller refuses others.
pub fn quantize_int8_row(row: &[f32]) -> (Vec<i8>, f32) {
    let mut q = vec![0; row.len()];
    let s = quantize_int8_row_into(row, &mut q);
    (q, s)
}

/// [`quantize_int8_row`] into `out` (as long as `row`), returning the scale: the int8
/// products quantise each row of activations by it on every call, without allocating.
pub fn quantize_int8_row_into(row: &[f32], out: &mut [i8]) -> f32 {
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if max == 0.0 {
        out.fill(0);
        return 0.0;
    }
    let s = max / 127.0;
    for (o, v) in out.iter_mut().zip(row) {
        *o = round_half_away(v / s).clamp(-127.0, 127.0) as i8;
    }
    s
}

/// `x.round()` (halves away from zero) for `|x| < 2³¹`, without the libm call `round`
/// is on x86-64's baseline: the truncation is one instruction, and `x - t` is exact
/// (the sign of a zero kept, as `round` keeps it).
#[inline(always)]
fn round_half_away(x: f32) -> f32 {
    let t = (x as i32 as f32).copysign(x);
    if (x - t).abs() >= 0.5 {
        t + 1f32.copysign(x)
    } else {
        t
    }
}

/// A builder's own op application, which [`Precision::apply`] wraps.
pub type ApplyFn<Bu> = fn(
    &mut Bu,
    Op<<Bu as Builder>::Dim>,
    &[&<Bu as Builder>::Value],
) -> Result<<Bu as Builder>::Value>;

/// How a model computes: its policy for the dtype of each op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Every op in the dtype of its inputs (f32 throughout for f32 models).
    #[default]
    F32,
    /// Matrix products with bf16 operands (results cast back to f32); the rest in f32.
    Bf16,
    /// Matrix products with f16 operands (results cast back to f32), the rest in f32,
    /// and training steps loss-scaled.
    F16,
    /// Inference with int8 weights: each weight [`Precision::quantizes`] is held as i8
    /// with one f32 scale per row (`*.weight_scale`), its products are
    /// [`Op::MatMulInt8`] and its lookups dequantise the rows they take; the rest in
    /// f32. Nothing trains under it.
    Int8,
}

impl Precision {
    /// The policies, as [`Precision::name`] writes them.
    pub const ALL: [Precision; 4] = [
        Precision::F32,
        Precision::Bf16,
        Precision::F16,
        Precision::Int8,
    ];

    /// The policy's name: `f32`, `bf16`, `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
            Precision::Int8 => "int8",
        }
    }

    /// The policy named `name` (`f32`, `bf16`, `f16`, `int8`); an error naming the ones
    /// there are.
    pub fn parse(name: &str) -> Result<Self> {
        if let Some(p) = Self::ALL.into_iter().find(|p| p.name() == name) {
            return Ok(p);
        }
        Err(Error::invalid(
            "precision",
            format!(
                "`{name}` is not a precision: the precisions are {}",
                Self::ALL.map(Precision::name).join(", ")
            ),
        ))
    }

    /// The dtype the narrowed ops compute in, `None` under `f32`.
    pub fn half(self) -> Option<DType> {
        match self {
            Precision::F32 | Precision::Int8 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }

    /// Whether models under this policy train (int8 instances are for inference).
    pub fn trains(self) -> bool {
        self != Precision::Int8
    }

    /// Whether this policy holds the tensor `name` of `dims` and `dtype` (of a layer or
    /// a checkpoint) as int8 with per-row scales: under [`Precision::Int8`], an f32
    /// matrix named `weight` or `*.weight` (a linear layer's `[out, in]`, an
    /// embedding's table). The one rule the layers, `kiln-quantize` and
    /// `embed!` into an int8 instance follow.
    pub fn quantizes(self, name: &str, dims: &[usize], dtype: DType) -> bool {
        self == Precision::Int8
            && (name == "weight" || name.ends_with(".weight"))
            && dims.len() == 2
            && dtype == DType::F32
    }

    /// Whether training steps under this policy scale the loss: gradients that f16
    /// would flush to zero are kept in range by starting the backward pass from the
    /// loss scale, and divided by it again before the optimizer sees them.
    pub fn loss_scaled(self) -> bool {
        self == Precision::F16
    }

    /// The dtype `op` computes in under this policy when its inputs have the dtypes
    /// `inputs`, if narrower than theirs: its inputs are cast to it and its result back.
    pub fn narrowed<D: SymDim>(self, op: &Op<D>, inputs: &[DType]) -> Option<DType> {
        match op {
            Op::MatMul | Op::Attention(_) if inputs.iter().all(|&d| d == DType::F32) => self.half(),
            _ => None,
        }
    }

    /// Applies `op` to `inputs` on `builder` under this policy: through `apply` as it
    /// is, or, where [`Precision::narrowed`] says so, between casts of its inputs and
    /// of its result. `apply` is the builder's own op application (a builder's
    /// [`Builder::apply`] calls this with its inner step).
    pub fn apply<Bu: Builder + ?Sized>(
        self,
        builder: &mut Bu,
        op: Op<Bu::Dim>,
        inputs: &[&Bu::Value],
        apply: ApplyFn<Bu>,
    ) -> Result<Bu::Value> {
        let dtypes: Vec<DType> = inputs.iter().map(|v| builder.meta(v).dtype).collect();
        let Some(narrow) = self.narrowed(&op, &dtypes) else {
            return apply(builder, op, inputs);
        };
        let mut cast = Vec::with_capacity(inputs.len());
        for v in inputs {
            cast.push(apply(builder, Op::Cast { dtype: narrow }, &[v])?);
        }
        let refs: Vec<&Bu::Value> = cast.iter().collect();
        let out = apply(builder, op, &refs)?;
        // Each policy narrows ops whose inputs share one dtype (checked by `narrowed`).
        apply(builder, Op::Cast { dtype: dtypes[0] }, &[&out])
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_int8_rounding_is_round_half_away_from_zero() {
        // Halves, the f32 just below a half (which `(x + 0.5).floor()` gets wrong),
        // and every step of a fine sweep, against `f32::round`.
        let below_half = 0.5f32.next_down();
        let mut xs = vec![0.5, -0.5, 1.5, -2.5, 126.5, -126.5, below_half, -below_half];
        xs.extend((-300_000..=300_000).map(|i| i as f32 * 0.000_43));
        for x in xs {
            assert_eq!(round_half_away(x).to_bits(), x.round().to_bits(), "{x}");
        }
        let (q, s) = quantize_int8_row(&[1.0, -0.5, 0.25, 0.0]);
        assert_eq!((q, s), (vec![127, -64, 32, 0], 1.0 / 127.0));
    }

    #[test]
    fn bf16_narrows_f32_products_only() {
        let f = [DType::F32, DType::F32];
        assert_eq!(
            Precision::Bf16.narrowed::<usize>(&Op::MatMul, &f),
            Some(DType::BF16)
        );
        assert_eq!(Precision::F32.narrowed::<usize>(&Op::MatMul, &f), None);
        assert_eq!(
            Precision::Bf16.narrowed::<usize>(&Op::MatMul, &[DType::F64, DType::F64]),
            None
        );
        let attention = Op::<usize>::Attention(crate::AttentionSpec::new(0.5, true));
        assert_eq!(
            Precision::Bf16.narrowed(&attention, &[DType::F32; 3]),
            Some(DType::BF16)
        );
        assert_eq!(Precision::F32.narrowed(&attention, &[DType::F32; 3]), None);
        assert_eq!(
            Precision::F16.narrowed(&attention, &[DType::F32; 3]),
            Some(DType::F16)
        );
        assert_eq!(
            Precision::F16.narrowed::<usize>(&Op::MatMul, &f),
            Some(DType::F16)
        );
        let softmax_part = Op::<usize>::Cast { dtype: DType::F32 };
        assert_eq!(Precision::Bf16.narrowed(&softmax_part, &[DType::F32]), None);
    }

    #[test]
    fn names_round_trip_and_others_are_refused_by_name() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        let e = Precision::parse("fp8").unwrap_err().to_string();
        assert!(
            e.contains("`fp8` is not a precision") && e.contains("f32, bf16, f16, int8"),
            "{e}"
        );
        assert!(Precision::F16.loss_scaled());
        assert!(!Precision::Bf16.loss_scaled() && !Precision::F32.loss_scaled());
    }
}
