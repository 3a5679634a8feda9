//! Symbolic dims: polynomials over const generics (`B`) and run-time sizes, with
//! literal coefficients. Literal dims are checked exactly; a const generic matches
//! only itself (as rustc's `Const<B>` would); a run-time size matches anything and is
//! left to the run-time check.

use kiln_tensor::{Result, SymDim};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use std::cell::Cell;
use std::fmt;

/// A factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    /// A const generic parameter of the method (`B`).
    Param(String),
    /// A size known only at run time (a `Dyn` input dim, or a size derived from one).
    Runtime(u32),
}

/// A sum of monomials `coef · Π atoms`, kept sorted with like terms merged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SDim(Vec<(usize, Vec<Atom>)>);

thread_local! {
    static NEXT_RUNTIME: Cell<u32> = const { Cell::new(0) };
}

impl SDim {
    /// A const generic parameter.
    pub fn param(name: &str) -> Self {
        SDim(vec![(1, vec![Atom::Param(name.to_string())])])
    }

    /// A fresh run-time size.
    pub fn fresh_runtime() -> Self {
        let id = NEXT_RUNTIME.with(|c| {
            let v = c.get();
            c.set(v + 1);
            v
        });
        SDim(vec![(1, vec![Atom::Runtime(id)])])
    }

    /// The run-time atoms this dim mentions.
    pub fn runtime_atoms(&self) -> Vec<u32> {
        self.0
            .iter()
            .flat_map(|(_, a)| a.iter())
            .filter_map(|a| match a {
                Atom::Runtime(i) => Some(*i),
                Atom::Param(_) => None,
            })
            .collect()
    }

    /// When this dim is exactly one run-time atom, its id.
    pub fn as_runtime(&self) -> Option<u32> {
        match self.0.as_slice() {
            [(1, atoms)] => match atoms.as_slice() {
                [Atom::Runtime(i)] => Some(*i),
                _ => None,
            },
            _ => None,
        }
    }

    /// When this dim is exactly one const generic, its name.
    pub fn as_param(&self) -> Option<&str> {
        match self.0.as_slice() {
            [(1, atoms)] => match atoms.as_slice() {
                [Atom::Param(p)] => Some(p),
                _ => None,
            },
            _ => None,
        }
    }

    fn normalize(mut terms: Vec<(usize, Vec<Atom>)>) -> Self {
        for t in terms.iter_mut() {
            t.1.sort();
        }
        terms.sort_by(|a, b| a.1.cmp(&b.1));
        let mut out: Vec<(usize, Vec<Atom>)> = Vec::new();
        for (c, a) in terms {
            match out.last_mut() {
                Some(last) if last.1 == a => last.0 += c,
                _ => out.push((c, a)),
            }
        }
        out.retain(|t| t.0 != 0);
        SDim(out)
    }

    /// The dim as a type: `Const<784>`, `Const<B>`, or `Dyn` for anything else.
    pub fn to_type(&self) -> TokenStream {
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

    /// The dim as a `usize` expression; `runtime(id)` gives each run-time atom's.
    pub fn to_expr(&self, runtime: &dyn Fn(u32) -> TokenStream) -> TokenStream {
        if self.0.is_empty() {
            return quote!(0usize);
        }
        let terms: Vec<TokenStream> = self
            .0
            .iter()
            .map(|(c, atoms)| {
                let mut factors: Vec<TokenStream> = atoms
                    .iter()
                    .map(|a| match a {
                        Atom::Param(p) => {
                            let p = format_ident!("{}", p);
                            quote!(#p)
                        }
                        Atom::Runtime(i) => runtime(*i),
                    })
                    .collect();
                if *c != 1 || factors.is_empty() {
                    let c = proc_macro2::Literal::usize_unsuffixed(*c);
                    factors.insert(0, quote!(#c));
                }
                let mut it = factors.into_iter();
                let first = it.next().expect("at least one factor");
                it.fold(first, |acc, f| quote!(#acc * #f))
            })
            .collect();
        let mut it = terms.into_iter();
        let first = it.next().expect("non-empty");
        let sum = it.fold(first, |acc, t| quote!(#acc + #t));
        if self.0.len() > 1 || self.0[0].1.len() + usize::from(self.0[0].0 != 1) > 1 {
            quote!((#sum))
        } else {
            sum
        }
    }
}

impl fmt::Display for SDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "0");
        }
        let terms: Vec<String> = self
            .0
            .iter()
            .map(|(c, atoms)| {
                let mut parts: Vec<String> = Vec::new();
                if *c != 1 || atoms.is_empty() {
                    parts.push(c.to_string());
                }
                for a in atoms {
                    parts.push(match a {
                        Atom::Param(p) => p.clone(),
                        Atom::Runtime(_) => "Dyn".to_string(),
                    });
                }
                parts.join("*")
            })
            .collect();
        write!(f, "{}", terms.join(" + "))
    }
}

impl SymDim for SDim {
    fn lit(n: usize) -> Self {
        SDim::normalize(vec![(n, vec![])])
    }

    fn as_lit(&self) -> Option<usize> {
        match self.0.as_slice() {
            [] => Some(0),
            [(c, a)] if a.is_empty() => Some(*c),
            _ => None,
        }
    }

    fn matches(&self, other: &Self) -> Option<bool> {
        if self == other {
            Some(true)
        } else if !self.runtime_atoms().is_empty() || !other.runtime_atoms().is_empty() {
            None
        } else {
            Some(false)
        }
    }

    fn mul(&self, other: &Self) -> Self {
        let mut terms = Vec::new();
        for (c1, a1) in &self.0 {
            for (c2, a2) in &other.0 {
                let mut a = a1.clone();
                a.extend(a2.iter().cloned());
                terms.push((c1 * c2, a));
            }
        }
        SDim::normalize(terms)
    }

    fn add(&self, other: &Self) -> Self {
        let mut terms = self.0.clone();
        terms.extend(other.0.iter().cloned());
        SDim::normalize(terms)
    }

    fn derive(
        inputs: &[&Self],
        _what: &str,
        f: impl Fn(&[usize]) -> Result<usize>,
    ) -> Result<Self> {
        let lits: Option<Vec<usize>> = inputs.iter().map(|d| d.as_lit()).collect();
        match lits {
            Some(l) => Ok(SDim::lit(f(&l)?)),
            None => Ok(SDim::fresh_runtime()),
        }
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

    #[test]
    fn algebra() {
        let b = SDim::param("B");
        let l = SDim::lit(784);
        assert_eq!(b.mul(&l).to_string(), "784*B");
        assert_eq!(b.add(&b).to_string(), "2*B");
        assert_eq!(b.matches(&l), Some(false));
        assert_eq!(l.matches(&SDim::lit(784)), Some(true));
        let r = SDim::fresh_runtime();
        assert_eq!(r.matches(&l), None);
        assert_eq!(SDim::lit(2).mul(&SDim::lit(3)).as_lit(), Some(6));
    }
}
