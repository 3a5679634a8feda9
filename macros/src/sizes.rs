//! Named sizes: a `#[model]` struct's const parameters (`struct Gpt<const D: usize, ..>`)
//! and the size arithmetic over them (`Linear<D, {4 * D}>`, `reshape::<B, T, H, {D / H}>()`,
//! `x / ((D / H) as f32).sqrt()`), resolved to literals where an instance fixes them
//! (`#[model] type GptSmall = Gpt<128, 4, 4, 128>;`).
//!
//! Stable Rust cannot compute `{4 * D}` in a generic type, so a model with sizes is a
//! definition, not a type: each instance substitutes its sizes, evaluates every size
//! expression (a division must come out even, a size must be at least 1) and expands
//! as a model with literal sizes. The nested models of an instance are instantiated
//! with it, in a hidden module named after it (`__kiln_GptSmall::GptBlock__128_4`):
//! their definitions come bundled with the definition macro's, so no path written in
//! the definition's module has to resolve where the instance is declared.

use crate::impls::Def;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, GenericArgument, GenericParam, Generics, Ident, ItemType, PathArguments, Type};

/// The size parameters of a model struct, in order (empty for a model without sizes).
pub fn size_params(generics: &Generics) -> syn::Result<Vec<Ident>> {
    let mut out = Vec::new();
    for p in &generics.params {
        let GenericParam::Const(c) = p else {
            return Err(syn::Error::new(
                p.span(),
                "a #[model] struct's parameters are its sizes, `const D: usize`: the backend parameter `Be` is added for you",
            ));
        };
        let usize_ty = matches!(&c.ty, Type::Path(t) if t.path.is_ident("usize"));
        if !usize_ty {
            return Err(syn::Error::new(
                c.ty.span(),
                format!("a size is a `usize`: write `const {}: usize`", c.ident),
            ));
        }
        if c.default.is_some() {
            return Err(syn::Error::new(
                c.span(),
                "a size has no default: each instance sets every size",
            ));
        }
        let name = c.ident.to_string();
        if name == "Be" || name == "Dyn" || crate::dsl::dtype_named(&name).is_some() {
            return Err(syn::Error::new(
                c.ident.span(),
                format!("`{name}` is taken by the model language; name the size otherwise"),
            ));
        }
        out.push(c.ident.clone());
    }
    if let Some(w) = &generics.where_clause {
        return Err(syn::Error::new(
            w.span(),
            "a #[model] struct takes no where clause",
        ));
    }
    Ok(out)
}

/// The mistakes of a model's impl that show without sizes: a method's size named like
/// one of the model's.
pub fn check_definition(params: &[Ident], imp: &syn::ItemImpl, model: &Ident) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    for it in &imp.items {
        let syn::ImplItem::Fn(f) = it else { continue };
        for p in &f.sig.generics.params {
            if let GenericParam::Const(c) = p {
                if params.contains(&c.ident) {
                    errors.push(syn::Error::new(
                        c.ident.span(),
                        format!("`{}` is already a size of `{model}`; name this method's size otherwise", c.ident),
                    ));
                }
            }
        }
    }
    errors
}

/// `e` as compile errors, each message followed by `context` (which instance it came
/// from), keeping each error's whole span.
pub fn errors_in(e: &syn::Error, context: &str) -> TokenStream {
    use proc_macro2::{Group, Literal, TokenTree};
    fn rewrite(ts: TokenStream, message: &str) -> TokenStream {
        ts.into_iter()
            .map(|t| match t {
                TokenTree::Group(g) => {
                    let mut out = Group::new(g.delimiter(), rewrite(g.stream(), message));
                    out.set_span(g.span());
                    TokenTree::Group(out)
                }
                TokenTree::Literal(l) => {
                    let mut out = Literal::string(message);
                    out.set_span(l.span());
                    TokenTree::Literal(out)
                }
                other => other,
            })
            .collect()
    }
    e.clone()
        .into_iter()
        .map(|one| {
            let message = format!("{one}{context}");
            rewrite(one.to_compile_error(), &message)
        })
        .collect()
}

/// Sizes fixed by an instance: each parameter's name and value.
pub type Env = Vec<(Ident, u64)>;

/// A number a size expression evaluates to.
#[derive(Clone, Copy, Debug)]
enum Num {
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
fn size_value(id: &Ident, env: &Env) -> Option<u64> {
    env.iter().find(|(n, _)| n == id).map(|&(_, v)| v)
}

/// Whether `e` mentions a size name anywhere.
fn mentions_size(e: &Expr, env: &Env) -> bool {
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
fn text(e: &impl ToTokens) -> String {
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
fn eval(e: &Expr, env: &Env) -> Option<Result<Num, String>> {
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

fn show(n: Num) -> String {
    match n {
        Num::Int(i) => i.to_string(),
        Num::Float(f) => f.to_string(),
    }
}

/// One arithmetic step; `Err` says what went wrong.
fn binary(op: &syn::BinOp, l: Num, r: Num) -> Result<Num, &'static str> {
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
struct Subst<'a> {
    env: &'a Env,
    errors: Vec<syn::Error>,
}

impl Subst<'_> {
    /// A size in a type (`Linear<D, {4 * D}>`, `[Block; L]`): a whole number from 1 up.
    fn size(&mut self, e: &Expr) -> Option<Expr> {
        match eval(e, self.env)? {
            Ok(Num::Int(v)) if (1..=crate::dsl::MAX_SIZE as i128).contains(&v) => {
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

/// The type paths among a field type that name other models (`Block`,
/// `blocks::Block`, `GptBlock<D, H>`, inside arrays too), for gathering definitions
/// and instantiating them.
pub fn model_paths_mut(ty: &mut Type, f: &mut dyn FnMut(&mut syn::TypePath)) {
    match ty {
        Type::Array(a) => model_paths_mut(&mut a.elem, f),
        Type::Paren(p) => model_paths_mut(&mut p.elem, f),
        Type::Group(g) => model_paths_mut(&mut g.elem, f),
        Type::Path(p) if p.qself.is_none() && crate::dsl::names_model(&p.path) => f(p),
        _ => {}
    }
}

/// `path` without generic arguments on its last segment (`GptBlock<D, H>` → `GptBlock`).
pub fn bare_path(path: &syn::Path) -> syn::Path {
    let mut p = path.clone();
    if let Some(last) = p.segments.last_mut() {
        last.arguments = PathArguments::None;
    }
    p
}

/// The key of an instance of `name` at `values`: `GptBlock__128_4` (the name alone
/// without sizes).
fn instance_key(name: &Ident, values: &[u64]) -> Ident {
    if values.is_empty() {
        return name.clone();
    }
    let vals: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format_ident!("{}__{}", name, vals.join("_"))
}

/// How a model's name reads in messages: an instance key `GptBlock__128_4` reads
/// `GptBlock<128, 4>`.
pub fn display_name(key: &str) -> String {
    match key.split_once("__") {
        Some((name, sizes))
            if !name.is_empty() && sizes.split('_').all(|s| s.parse::<u64>().is_ok()) =>
        {
            format!(
                "{name}<{}>",
                sizes.split('_').collect::<Vec<_>>().join(", ")
            )
        }
        _ => key.to_string(),
    }
}

/// The values of a model path's size arguments, already literals after substitution.
fn literal_args(p: &syn::TypePath, errors: &mut Vec<syn::Error>) -> Option<Vec<u64>> {
    let last = p.path.segments.last()?;
    let args = match &last.arguments {
        PathArguments::None => return Some(Vec::new()),
        PathArguments::AngleBracketed(a) => &a.args,
        PathArguments::Parenthesized(x) => {
            errors.push(syn::Error::new(x.span(), "a model's sizes go in `<..>`"));
            return None;
        }
    };
    let mut out = Vec::new();
    for a in args {
        let value = match a {
            GenericArgument::Const(e) => eval(e, &Vec::new()),
            GenericArgument::Type(Type::Path(t)) if t.path.get_ident().is_some() => {
                errors.push(syn::Error::new(
                    a.span(),
                    format!(
                        "unknown size `{}`: a model's sizes are integers or the sizes of the model holding it",
                        text(a)
                    ),
                ));
                return None;
            }
            _ => None,
        };
        match value {
            Some(Ok(Num::Int(v))) if (1..=crate::dsl::MAX_SIZE as i128).contains(&v) => {
                out.push(v as u64)
            }
            Some(Err(m)) => {
                errors.push(syn::Error::new(a.span(), m));
                return None;
            }
            _ => {
                errors.push(syn::Error::new(
                    a.span(),
                    format!(
                        "a model's size is a whole number from 1 up; `{}` is not",
                        text(a)
                    ),
                ));
                return None;
            }
        }
    }
    Some(out)
}

/// Instantiates models: the definitions at hand and the instances made so far.
struct Instantiator<'a> {
    defs: &'a [Def],
    /// The instances of nested models, in the order made (each one's own nested ones
    /// first).
    made: Vec<Def>,
    /// Keys being made now (a definition that holds itself is refused).
    making: Vec<Ident>,
    errors: Vec<syn::Error>,
}

impl Instantiator<'_> {
    /// `def` with its sizes set to `values`, named `name`; its nested models'
    /// types point at their instances, under `prefix` (the hidden module) when given.
    fn instantiate(
        &mut self,
        def: &Def,
        values: &[u64],
        name: &Ident,
        prefix: Option<&Ident>,
        at: Span,
    ) -> Option<Def> {
        let params = match size_params(&def.item.generics) {
            Ok(p) => p,
            // Reported by the definition's own expansion.
            Err(_) => return None,
        };
        let model = &def.item.ident;
        if params.len() != values.len() {
            let given: Vec<String> = values.iter().map(|v| v.to_string()).collect();
            let wanted: Vec<String> = params.iter().map(|p| p.to_string()).collect();
            self.errors.push(syn::Error::new(
                at,
                if params.is_empty() {
                    format!("`{model}` has no sizes to set; use `{model}` itself")
                } else {
                    format!(
                        "`{model}` takes {} size{} ({}), given {}{}",
                        params.len(),
                        if params.len() == 1 { "" } else { "s" },
                        wanted.join(", "),
                        values.len(),
                        if given.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", given.join(", "))
                        }
                    )
                },
            ));
            return None;
        }
        let env: Env = params.into_iter().zip(values.iter().copied()).collect();
        let mut item = def.item.clone();
        let mut imp = def.imp.clone();
        item.generics = Generics::default();
        imp.generics = Generics::default();
        item.ident = name.clone();
        imp.self_ty = Box::new(syn::parse_quote_spanned!(imp.self_ty.span()=> #name));
        let mut subst = Subst {
            env: &env,
            errors: Vec::new(),
        };
        subst.visit_item_struct_mut(&mut item);
        subst.visit_item_impl_mut(&mut imp);
        self.errors.extend(subst.errors);
        if let syn::Fields::Named(named) = &mut item.fields {
            for f in named.named.iter_mut() {
                if crate::structs::is_dynamic_field(f) {
                    continue;
                }
                model_paths_mut(&mut f.ty, &mut |p| self.nested(p, prefix));
            }
        }
        // Every instance is public in its hidden module: the holder's accessors
        // return it.
        item.vis = syn::parse_quote!(pub);
        Some(Def {
            item,
            imp,
            broken: def.broken,
        })
    }

    /// Points a nested model's type at its instance, making the instance if new.
    fn nested(&mut self, p: &mut syn::TypePath, prefix: Option<&Ident>) {
        let Some(values) = literal_args(p, &mut self.errors) else {
            return;
        };
        let name = crate::dsl::model_name(&p.path);
        let Some(def) = self.defs.iter().find(|d| d.item.ident == name) else {
            self.errors.push(syn::Error::new(
                p.span(),
                format!("the definition of `{name}` did not reach this instance"),
            ));
            return;
        };
        let key = instance_key(&def.item.ident, &values);
        if self.making.contains(&key) {
            self.errors
                .push(syn::Error::new(p.span(), format!("`{name}` holds itself")));
            return;
        }
        if !self.made.iter().any(|d| d.item.ident == key) {
            self.making.push(key.clone());
            let made = self.instantiate(def, &values, &key, None, p.span());
            self.making.pop();
            let Some(made) = made else { return };
            self.made.push(made);
        }
        let span = p.span();
        *p = match prefix {
            Some(m) => syn::parse_quote_spanned!(span=> #m::#key),
            None => syn::parse_quote_spanned!(span=> #key),
        };
    }
}

/// How much a size is scaled to vary it: odd, so powers of two (the usual sizes) part.
const VARIED: u64 = 3;

/// Mistakes that the instance's numbers hide. A definition must hold for any sizes, but
/// it is checked at an instance's numbers, where sizes the code keeps apart may happen
/// to be equal: `q.matmul(k)` without the transpose checks when `T` equals `D / H`. So
/// a well-formed instance is checked again with its sizes varied, as a stand-in for
/// checking them as symbols: every size ×3 (sums, products and quotients keep their
/// relations, while sizes of different degree part: `T` from `D / H`), then each size
/// ×3 alone (`T` from `D`). A variation the definition's own arithmetic rejects (an
/// uneven `D / H`) says nothing and is skipped; the first one whose bodies have shape
/// mistakes gives them, with a note naming its sizes.
fn coincidences(
    def: &Def,
    defs: &[Def],
    values: &[u64],
    params: &[Ident],
    alias: &ItemType,
    precision: kiln_tensor::Precision,
) -> Option<(Vec<syn::Error>, String)> {
    if params.is_empty() {
        return None;
    }
    let check = |values: &[u64]| -> Option<Vec<syn::Error>> {
        let mut inst = Instantiator {
            defs,
            made: Vec::new(),
            making: vec![alias.ident.clone()],
            errors: Vec::new(),
        };
        let top = inst.instantiate(def, values, &alias.ident, None, alias.ident.span())?;
        if !inst.errors.is_empty()
            || inst
                .made
                .iter()
                .chain([&top])
                .any(|d| crate::structs::parse_fields(&d.item).is_err())
        {
            return None;
        }
        crate::impls::shape_mistakes(&top.item, &top.imp, &inst.made, precision)
    };
    // The instance's own mistakes are reported by its expansion.
    if check(values).is_none_or(|e| !e.is_empty()) {
        return None;
    }
    let mut variations = vec![values.iter().map(|v| v * VARIED).collect::<Vec<_>>()];
    if values.len() > 1 {
        for i in 0..values.len() {
            let mut v = values.to_vec();
            v[i] *= VARIED;
            variations.push(v);
        }
    }
    for varied in variations {
        let Some(mistakes) = check(&varied) else {
            continue;
        };
        let Some(first) = mistakes.first() else {
            continue;
        };
        let shown = |vals: &[u64]| {
            params
                .iter()
                .zip(vals)
                .map(|(p, v)| format!("{p} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut seen = std::collections::HashSet::new();
        let mistakes = std::iter::once(first)
            .chain(&mistakes[1..])
            .filter(|e| seen.insert(e.to_string()))
            .cloned()
            .collect();
        let note = format!(
            " (with the sizes varied to {}: at {} this checks only because sizes the code keeps apart happen to be equal; a definition must hold for any sizes, so write the size you mean)",
            shown(&varied),
            shown(values)
        );
        return Some((mistakes, note));
    }
    None
}

/// Expands `#[model] type Name = Model<sizes..>;`, given `Model`'s definition and the
/// definitions bundled with it: the model with those sizes, as if written with
/// literals, named `Name`, its nested models instantiated in a hidden module.
pub fn expand_instance(
    alias: ItemType,
    precision: kiln_tensor::Precision,
    defs: Vec<Def>,
) -> TokenStream {
    let fail = |e: syn::Error| e.to_compile_error();
    let Type::Path(target) = &*alias.ty else {
        return fail(syn::Error::new(
            alias.ty.span(),
            "expected a model with its sizes, `Gpt<128, 4>`",
        ));
    };
    if !alias.generics.params.is_empty() {
        return fail(syn::Error::new(
            alias.generics.span(),
            "an instance fixes every size: it takes no parameters",
        ));
    }
    let name = crate::dsl::model_name(&target.path);
    let Some(def) = defs.iter().find(|d| d.item.ident == name) else {
        return fail(syn::Error::new(
            target.span(),
            format!("`{name}` is not a #[model]"),
        ));
    };
    let (attrs, vis, ident) = (&alias.attrs, &alias.vis, &alias.ident);
    if def.broken {
        // Its own expansion reported its mistakes: this instance adds none.
        let placeholder: syn::ItemStruct = syn::parse_quote!(#(#attrs)* #vis struct #ident {});
        return crate::structs::placeholder(&placeholder, quote!());
    }
    let mut errors = Vec::new();
    let Some(values) = literal_args(target, &mut errors) else {
        return errors.into_iter().map(fail).collect();
    };
    let params = size_params(&def.item.generics).unwrap_or_default();
    let hidden = format_ident!("__kiln_{}", alias.ident);
    let mut inst = Instantiator {
        defs: &defs,
        made: Vec::new(),
        making: vec![alias.ident.clone()],
        errors,
    };
    let top = inst.instantiate(def, &values, &alias.ident, Some(&hidden), target.span());
    let sizes: Vec<String> = params
        .iter()
        .zip(&values)
        .map(|(p, v)| format!("{p} = {v}"))
        .collect();
    let context = if params.len() == values.len() {
        format!(" (in `{}` = `{name}<{}>`)", alias.ident, sizes.join(", "))
    } else {
        String::new()
    };
    // The parts of the instance must parse as a model's fields; what does not was a
    // size the definition's expansion could not check.
    if inst.errors.is_empty() {
        for d in inst.made.iter().chain(&top) {
            if let Err(e) = crate::structs::parse_fields(&d.item) {
                inst.errors.extend(e);
            }
        }
    }
    if !inst.errors.is_empty() || top.is_none() {
        // One message per mistake: an uneven `D / H` is reported where it is first
        // met, not at each of its uses.
        let mut seen = std::collections::HashSet::new();
        let errors = inst
            .errors
            .iter()
            .flat_map(|e| e.clone())
            .filter(|e| seen.insert(e.to_string()))
            .map(|e| errors_in(&e, &context));
        let placeholder: syn::ItemStruct = syn::parse_quote!(#(#attrs)* #vis struct #ident {});
        return crate::structs::placeholder(&placeholder, quote!(#(#errors)*));
    }
    let top = top.expect("checked above");
    // Reported beside a working expansion: the model runs at these numbers, and its
    // callers get no errors of their own.
    let coincidences: TokenStream = coincidences(def, &defs, &values, &params, &alias, precision)
        .map(|(mistakes, note)| {
            let context = format!("{note}{context}");
            mistakes.iter().map(|e| errors_in(e, &context)).collect()
        })
        .unwrap_or_default();
    let mut item = top.item;
    item.attrs = alias.attrs.clone();
    let mut doc = match sizes.is_empty() {
        true => format!("`{name}`"),
        false => format!("`{name}` with {}", sizes.join(", ")),
    };
    if precision != kiln_tensor::Precision::F32 {
        doc += &format!(", its matrix products in {precision}");
    }
    doc += ".";
    if item.attrs.iter().any(|a| a.path().is_ident("doc")) {
        item.attrs.push(syn::parse_quote!(#[doc = ""]));
    }
    item.attrs.push(syn::parse_quote!(#[doc = #doc]));
    item.vis = alias.vis.clone();
    let parts = inst.made.iter().map(|d| {
        crate::structs::expand_struct(d.item.clone()).unwrap_or_else(|e| e.to_compile_error())
    });
    let top_struct =
        crate::structs::expand_struct(item.clone()).unwrap_or_else(|e| e.to_compile_error());
    let top_impl =
        crate::impls::expand_impl_in(item, top.imp, inst.made.clone(), &context, precision);
    quote! {
        #coincidences
        #top_struct
        #top_impl
        #[doc(hidden)]
        #[allow(non_snake_case, non_camel_case_types)]
        pub mod #hidden {
            #(#parts)*
        }
    }
}
