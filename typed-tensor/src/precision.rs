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

use crate::builder::Builder;
use crate::op::Op;
use crate::{DType, Error, Result, SymDim};

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
}

impl Precision {
    /// The policies, as [`Precision::name`] writes them.
    pub const ALL: [Precision; 2] = [Precision::F32, Precision::Bf16];

    /// The policy's name: `f32`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// The policy named `name` (`f32`, `bf16`); an error naming the ones there are.
    pub fn parse(name: &str) -> Result<Self> {
        if let Some(p) = Self::ALL.into_iter().find(|p| p.name() == name) {
            return Ok(p);
        }
        let why = match name {
            "f16" => "f16 products need dynamic loss scaling, which Kiln does not have yet; use bf16 (same speed, f32's range)".to_string(),
            _ => format!("`{name}` is not a precision"),
        };
        Err(Error::invalid(
            "precision",
            format!(
                "{why}: the precisions are {}",
                Self::ALL.map(Precision::name).join(", ")
            ),
        ))
    }

    /// The dtype `op` computes in under this policy when its inputs have the dtypes
    /// `inputs`, if narrower than theirs: its inputs are cast to it and its result back.
    pub fn narrowed<D: SymDim>(self, op: &Op<D>, inputs: &[DType]) -> Option<DType> {
        match (self, op) {
            (Precision::Bf16, Op::MatMul | Op::Attention(_))
                if inputs.iter().all(|&d| d == DType::F32) =>
            {
                Some(DType::BF16)
            }
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
        let softmax_part = Op::<usize>::Cast { dtype: DType::F32 };
        assert_eq!(Precision::Bf16.narrowed(&softmax_part, &[DType::F32]), None);
    }

    #[test]
    fn names_round_trip_and_others_are_refused_by_name() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        let e = Precision::parse("f16").unwrap_err().to_string();
        assert!(
            e.contains("dynamic loss scaling") && e.contains("f32, bf16"),
            "{e}"
        );
        let e = Precision::parse("fp8").unwrap_err().to_string();
        assert!(e.contains("`fp8` is not a precision"), "{e}");
    }
}
