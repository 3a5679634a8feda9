//! Symbolic dims for the macro: [`kiln_fusion::SDim`] (polynomials over const generics
//! and run-time sizes, shared with the planner so plans keep the same dims) plus how
//! the macro writes them back as Rust types and expressions.

pub use kiln_fusion::sym::SDim;
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

/// Writing a symbolic dim as Rust tokens.
pub trait DimTokens {
    /// The dim as a type: `Const<784>`, `Const<B>`, or `Dyn` for anything else.
    fn to_type(&self) -> TokenStream;
}

impl DimTokens for SDim {
    fn to_type(&self) -> TokenStream {
        use kiln_tensor::SymDim;
        if let Some(n) = self.as_lit() {
            let n = proc_macro2::Literal::usize_unsuffixed(n);
            return quote!(::kiln::tensor::Const<#n>);
        }
        if let Some(p) = self.as_param() {
            let p = format_ident!("{}", p);
            return quote!(::kiln::tensor::Const<#p>);
        }
        quote!(::kiln::tensor::Dyn)
    }
}

/// An f64 as tokens: a literal, negated when negative; the named constants for
/// infinities and NaN.
pub fn f64_tokens(v: f64) -> TokenStream {
    if v.is_nan() {
        quote!(f64::NAN)
    } else if v.is_infinite() {
        if v > 0.0 {
            quote!(f64::INFINITY)
        } else {
            quote!(f64::NEG_INFINITY)
        }
    } else if v < 0.0 || (v == 0.0 && v.is_sign_negative()) {
        let a = proc_macro2::Literal::f64_suffixed(-v);
        quote!(-#a)
    } else {
        let a = proc_macro2::Literal::f64_suffixed(v);
        quote!(#a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_tensor::SymDim;

    #[test]
    fn dims_as_tokens() {
        let b = SDim::param("B");
        assert_eq!(b.to_type().to_string(), ":: kiln :: tensor :: Const < B >");
        assert_eq!(
            SDim::lit(784).mul(&b).to_type().to_string(),
            ":: kiln :: tensor :: Dyn"
        );
        assert_eq!(
            SDim::fresh_runtime().to_type().to_string(),
            ":: kiln :: tensor :: Dyn"
        );
    }
}
