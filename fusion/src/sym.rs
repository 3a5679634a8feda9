//! Symbolic dims: polynomials over named size parameters (a const generic `B`) and
//! run-time sizes, with literal coefficients. The `#[model]` macro infers shapes with
//! them; plans keep them, and are resolved to numbers when they first run.
//!
//! Literal dims are checked exactly; a parameter matches only itself (as rustc's
//! `Const<B>` would); a run-time size matches anything and is left to the run-time check.

use kiln_tensor::{Error, Result, SymDim};
use std::cell::Cell;
use std::fmt;

/// A factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    /// A named size parameter (a const generic, `B`).
    Param(String),
    /// A size known only at run time (a `Dyn` input dim, or one derived from it).
    Runtime(u32),
}

/// A sum of monomials `coef · Π atoms`, kept sorted with like terms merged.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct SDim(Vec<(usize, Vec<Atom>)>);

thread_local! {
    static NEXT_RUNTIME: Cell<u32> = const { Cell::new(0) };
}

impl SDim {
    /// A named size parameter.
    pub fn param(name: &str) -> Self {
        SDim(vec![(1, vec![Atom::Param(name.to_string())])])
    }

    /// The run-time size `id` (a plan recorded at run time numbers its own sizes).
    pub fn runtime(id: u32) -> Self {
        SDim(vec![(1, vec![Atom::Runtime(id)])])
    }

    /// A fresh run-time size (ids are unique per thread, so per macro expansion).
    pub fn fresh_runtime() -> Self {
        let id = NEXT_RUNTIME.with(|c| {
            let v = c.get();
            c.set(v + 1);
            v
        });
        SDim(vec![(1, vec![Atom::Runtime(id)])])
    }

    /// The monomials: `(coefficient, factors)`.
    pub fn terms(&self) -> &[(usize, Vec<Atom>)] {
        &self.0
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

    /// When this dim is exactly one parameter, its name.
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
                Some(last) if last.1 == a => last.0 = last.0.saturating_add(c),
                _ => out.push((c, a)),
            }
        }
        out.retain(|t| t.0 != 0);
        SDim(out)
    }

    /// The value, given the parameters' and run-time atoms' values.
    pub fn eval(
        &self,
        param: &dyn Fn(&str) -> Option<usize>,
        runtime: &dyn Fn(u32) -> Option<usize>,
    ) -> Result<usize> {
        let mut sum = 0usize;
        for (c, atoms) in &self.0 {
            let mut p = *c;
            for a in atoms {
                let v = match a {
                    Atom::Param(n) => param(n).ok_or_else(|| {
                        Error::invalid("plan", format!("no value for the size `{n}`"))
                    })?,
                    Atom::Runtime(i) => runtime(*i).ok_or_else(|| {
                        Error::invalid("plan", format!("run-time size ${i} is not known yet"))
                    })?,
                };
                p *= v;
            }
            sum += p;
        }
        Ok(sum)
    }

    /// The serialised form: `784*B+1`, run-time atoms as `$id` (see `parse`).
    pub fn to_text(&self) -> String {
        if self.0.is_empty() {
            return "0".into();
        }
        let terms: Vec<String> = self
            .0
            .iter()
            .map(|(c, atoms)| {
                let mut f = vec![c.to_string()];
                f.extend(atoms.iter().map(|a| match a {
                    Atom::Param(p) => p.clone(),
                    Atom::Runtime(i) => format!("${i}"),
                }));
                f.join("*")
            })
            .collect();
        terms.join("+")
    }

    /// Parses `to_text`'s form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || Error::Format(format!("`{s}` is not a dim"));
        let mut terms = Vec::new();
        for t in s.split('+') {
            let mut c = 1usize;
            let mut atoms = Vec::new();
            for f in t.trim().split('*') {
                let f = f.trim();
                if let Ok(n) = f.parse::<usize>() {
                    c *= n;
                } else if let Some(id) = f.strip_prefix('$') {
                    atoms.push(Atom::Runtime(id.parse().map_err(|_| bad())?));
                } else if !f.is_empty() && f.chars().all(|ch| ch.is_alphanumeric() || ch == '_') {
                    atoms.push(Atom::Param(f.to_string()));
                } else {
                    return Err(bad());
                }
            }
            terms.push((c, atoms));
        }
        Ok(SDim::normalize(terms))
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

    fn is_runtime(&self) -> bool {
        !self.runtime_atoms().is_empty()
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
                terms.push((c1.saturating_mul(*c2), a));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algebra_and_text() {
        let b = SDim::param("B");
        let l = SDim::lit(784);
        let p = b.mul(&l).add(&SDim::lit(1));
        assert_eq!(p.to_string(), "1 + 784*B");
        assert_eq!(SDim::parse(&p.to_text()).unwrap(), p);
        assert_eq!(b.matches(&l), Some(false));
        let r = SDim::fresh_runtime();
        assert_eq!(r.matches(&l), None);
        assert_eq!(SDim::parse(&r.to_text()).unwrap(), r);
        let v = p.eval(&|n| (n == "B").then_some(2), &|_| None).unwrap();
        assert_eq!(v, 1569);
    }
}
