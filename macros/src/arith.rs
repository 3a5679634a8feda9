//! Size arithmetic: the numbers a model's named sizes stand for and the constant
//! expressions over them (`{ 4 * D }`, `D / H`, `(D / H) as f32`), evaluated exactly
//! (an integer division must come out even), and their substitution into a
//! definition's tokens where an instance fixes them. The one place that knows what a
//! size expression means; everything else asks it.

use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, GenericArgument, Ident, Type};

/// The largest size a layer or tensor dim may have: 2^40 elements is far past any
/// memory; past it, products of sizes could overflow while the macro infers shapes.
pub const MAX_SIZE: usize = 1 << 40;

/// Sizes fixed by an instance: each parameter's name and value.
pub type Env = Vec<(Ident, u64)>;

/// A number a size expression evaluates to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn float(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// The value of a size name, if `id` is one.
pub(crate) fn size_value(id: &Ident, env: &Env) -> Option<u64> {
    env.iter().find(|(n, _)| n == id).map(|&(_, v)| v)
}

/// Whether `e` mentions a size name anywhere.
pub(crate) fn mentions_size(e: &Expr, env: &Env) -> bool {
    struct Find<'a> {
        env: &'a Env,
        found: bool,
    }
    impl syn::visit::Visit<'_> for Find<'_> {
        fn visit_path(&mut self, p: &syn::Path) {
            if p.get_ident()
                .is_some_and(|i| size_value(i, self.env).is_some())
            {
                self.found = true;
            }
            syn::visit::visit_path(self, p);
        }
    }
    let mut f = Find { env, found: false };
    syn::visit::Visit::visit_expr(&mut f, e);
    f.found
}

/// `e` as written, for messages (`D / H`).
pub(crate) fn text(e: &impl ToTokens) -> String {
    e.to_token_stream()
        .to_string()
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" . ", ".")
}

/// Evaluates a constant expression over sizes and numbers with Rust's arithmetic, but
/// exact: an integer division must come out even. `None` when `e` is not constant
/// (it names a tensor, calls a layer, ..).
pub(crate) fn eval(e: &Expr, env: &Env) -> Option<Result<Num, String>> {
    let r = match e {
        Expr::Lit(l) => match &l.lit {
            syn::Lit::Int(i) => Ok(Num::Int(i.base10_parse().ok()?)),
            syn::Lit::Float(f) => Ok(Num::Float(f.base10_parse().ok()?)),
            _ => return None,
        },
        Expr::Path(p) => Ok(Num::Int(size_value(p.path.get_ident()?, env)? as i128)),
        Expr::Paren(p) => return eval(&p.expr, env),
        Expr::Group(g) => return eval(&g.expr, env),
        Expr::Block(b) if b.block.stmts.len() == 1 => match &b.block.stmts[0] {
            syn::Stmt::Expr(inner, None) => return eval(inner, env),
            _ => return None,
        },
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => match eval(&u.expr, env)? {
            Ok(Num::Int(i)) => Ok(Num::Int(-i)),
            Ok(Num::Float(f)) => Ok(Num::Float(-f)),
            Err(m) => Err(m),
        },
        // A comparison or a logical operator does not compute a size: such an
        // expression is left to the body's own checks (`if D > 64` is an `if`).
        Expr::Binary(b)
            if !matches!(
                b.op,
                syn::BinOp::Add(_)
                    | syn::BinOp::Sub(_)
                    | syn::BinOp::Mul(_)
                    | syn::BinOp::Div(_)
                    | syn::BinOp::Rem(_)
            ) =>
        {
            return None
        }
        Expr::Binary(b) => {
            let l = eval(&b.left, env)?;
            let r = eval(&b.right, env)?;
            let (l, r) = match (l, r) {
                (Ok(l), Ok(r)) => (l, r),
                (Err(m), _) | (_, Err(m)) => return Some(Err(m)),
            };
            binary(&b.op, l, r).map_err(|why| {
                format!(
                    "`{}` {why}: {} {} {}",
                    text(e),
                    show(l),
                    text(&b.op),
                    show(r)
                )
            })
        }
        Expr::Cast(c) => {
            let v = match eval(&c.expr, env)? {
                Ok(v) => v,
                Err(m) => return Some(Err(m)),
            };
            let Type::Path(t) = &*c.ty else { return None };
            let to = t.path.get_ident()?.to_string();
            match to.as_str() {
                "f32" | "f64" => Ok(Num::Float(v.float())),
                "usize" | "u64" | "u32" | "i64" | "i32" => Ok(Num::Int(match v {
                    Num::Int(i) => i,
                    Num::Float(f) => f as i128,
                })),
                _ => return None,
            }
        }
        Expr::MethodCall(m) if m.turbofish.is_none() => {
            let v = match eval(&m.receiver, env)? {
                Ok(v) => v.float(),
                Err(msg) => return Some(Err(msg)),
            };
            let arg = |i: usize| -> Option<f64> { Some(eval(m.args.get(i)?, env)?.ok()?.float()) };
            let f = match (m.method.to_string().as_str(), m.args.len()) {
                ("sqrt", 0) => v.sqrt(),
                ("recip", 0) => 1.0 / v,
                ("ln", 0) => v.ln(),
                ("exp", 0) => v.exp(),
                ("powi", 1) | ("powf", 1) => v.powf(arg(0)?),
                _ => return None,
            };
            if f.is_finite() {
                Ok(Num::Float(f))
            } else {
                Err(format!("`{}` is not a finite number", text(e)))
            }
        }
        _ => return None,
    };
    Some(r)
}

/// The value of a constant integer expression without size names (`{ 4 * 32 }`), if
/// `e` is one: `Err` says why it is not a whole number, or not an exact one.
pub fn const_int(e: &Expr) -> Option<Result<i128, String>> {
    Some(match eval(e, &Vec::new())? {
        Ok(Num::Int(i)) => Ok(i),
        Ok(Num::Float(f)) => Err(format!("`{}` is {f}, not a whole number", text(e))),
        Err(m) => Err(m),
    })
}

pub(crate) fn show(n: Num) -> String {
    match n {
        Num::Int(i) => i.to_string(),
        Num::Float(f) => f.to_string(),
    }
}

/// One arithmetic step; `Err` says what went wrong.
pub(crate) fn binary(op: &syn::BinOp, l: Num, r: Num) -> Result<Num, &'static str> {
    use syn::BinOp::*;
    if let (Num::Int(a), Num::Int(b)) = (l, r) {
        let v = match op {
            Add(_) => a.checked_add(b),
            Sub(_) => a.checked_sub(b),
            Mul(_) => a.checked_mul(b),
            Div(_) | Rem(_) if b == 0 => return Err("divides by zero"),
            Div(_) if a % b != 0 => return Err("does not come out even"),
            Div(_) => Some(a / b),
            Rem(_) => Some(a % b),
            _ => return Err("uses an operator sizes do not have"),
        };
        return v.map(Num::Int).ok_or("overflows");
    }
    let (a, b) = (l.float(), r.float());
    let v = match op {
        Add(_) => a + b,
        Sub(_) => a - b,
        Mul(_) => a * b,
        Div(_) => a / b,
        _ => return Err("uses an operator numbers do not have here"),
    };
    if v.is_finite() {
        Ok(Num::Float(v))
    } else {
        Err("is not a finite number")
    }
}

/// Replaces size names and the constant expressions over them by literals.
pub(crate) struct Subst<'a> {
    /// The sizes' values.
    pub(crate) env: &'a Env,
    /// What could not be substituted (an uneven division, a size out of range).
    pub(crate) errors: Vec<syn::Error>,
    /// Each whole number substituted, with the size expression it came from (`D`,
    /// `4 * D`): how messages name a number of a definition checked at stand-in sizes.
    pub(crate) written: Vec<(u64, String)>,
}

impl Subst<'_> {
    /// Records that `e` came out as `v`, as the expression was written, without its
    /// braces.
    fn note(&mut self, v: u64, e: &Expr) {
        let written = text(e);
        let written = written
            .strip_prefix('{')
            .and_then(|w| w.strip_suffix('}'))
            .unwrap_or(&written)
            .trim()
            .to_string();
        if !self.written.contains(&(v, written.clone())) {
            self.written.push((v, written));
        }
    }

    /// A size in a type (`Linear<D, {4 * D}>`, `[Block; L]`): a whole number from 1 up.
    fn size(&mut self, e: &Expr) -> Option<Expr> {
        match eval(e, self.env)? {
            Ok(Num::Int(v)) if (1..=MAX_SIZE as i128).contains(&v) => {
                self.note(v as u64, e);
                let lit = proc_macro2::Literal::u64_unsuffixed(v as u64);
                Some(syn::parse_quote_spanned!(e.span()=> #lit))
            }
            Ok(Num::Int(v)) => {
                self.errors.push(syn::Error::new(
                    e.span(),
                    format!(
                        "the size `{}` is {v}; a size is at least 1 and at most 2^40",
                        text(e)
                    ),
                ));
                None
            }
            Ok(Num::Float(v)) => {
                self.errors.push(syn::Error::new(
                    e.span(),
                    format!("the size `{}` is {v}, not a whole number", text(e)),
                ));
                None
            }
            Err(m) => {
                self.errors.push(syn::Error::new(e.span(), m));
                None
            }
        }
    }
}

impl VisitMut for Subst<'_> {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        if mentions_size(e, self.env) {
            match eval(e, self.env) {
                Some(Ok(n)) => {
                    if let Num::Int(v) = n {
                        if let Ok(v) = u64::try_from(v) {
                            self.note(v, e);
                        }
                    }
                    let span = e.span();
                    let (neg, lit) = match n {
                        Num::Int(i) => (
                            i < 0,
                            proc_macro2::Literal::u128_unsuffixed(i.unsigned_abs()),
                        ),
                        Num::Float(f) => (f < 0.0, proc_macro2::Literal::f64_unsuffixed(f.abs())),
                    };
                    *e = if neg {
                        syn::parse_quote_spanned!(span=> (-#lit))
                    } else {
                        syn::parse_quote_spanned!(span=> #lit)
                    };
                    return;
                }
                Some(Err(m)) => {
                    self.errors.push(syn::Error::new(e.span(), m));
                    return;
                }
                None => {}
            }
        }
        syn::visit_mut::visit_expr_mut(self, e);
    }

    fn visit_generic_argument_mut(&mut self, a: &mut GenericArgument) {
        let expr = match &*a {
            GenericArgument::Type(Type::Path(p))
                if p.qself.is_none()
                    && p.path
                        .get_ident()
                        .is_some_and(|i| size_value(i, self.env).is_some()) =>
            {
                Some(Expr::Path(syn::ExprPath {
                    attrs: Vec::new(),
                    qself: None,
                    path: p.path.clone(),
                }))
            }
            GenericArgument::Const(e) if mentions_size(e, self.env) => Some(e.clone()),
            _ => None,
        };
        match expr {
            Some(e) => {
                if let Some(lit) = self.size(&e) {
                    *a = GenericArgument::Const(lit);
                }
            }
            None => syn::visit_mut::visit_generic_argument_mut(self, a),
        }
    }

    fn visit_type_array_mut(&mut self, t: &mut syn::TypeArray) {
        self.visit_type_mut(&mut t.elem);
        if mentions_size(&t.len, self.env) {
            if let Some(lit) = self.size(&t.len) {
                t.len = lit;
            }
        }
    }
}
