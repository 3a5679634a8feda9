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

use crate::arith::{eval, text, Env, Num, Subst};
use crate::impls::Mistakes;
use crate::lower::messages::errors_in;
use crate::model::Def;
use crate::model::{model_paths_mut, size_params};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{GenericArgument, Generics, Ident, ItemType, PathArguments, Type};

/// The key of an instance of `name` at `values`: `GptBlock__128_4` (the name alone
/// without sizes).
fn instance_key(name: &Ident, values: &[u64]) -> Ident {
    if values.is_empty() {
        return name.clone();
    }
    let vals: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format_ident!("{}__{}", name, vals.join("_"))
}

/// `Gpt<D = 128, H = 4>`: sizes given by name, which Rust reads as associated-const
/// bindings (and rustc refuses as unstable, E0658, before any macro runs). The one
/// error that says what to write: the values in the definition's order.
fn named_sizes(p: &syn::TypePath, model: &str, params: &[Ident]) -> Option<syn::Error> {
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    if !a
        .args
        .iter()
        .any(|g| matches!(g, GenericArgument::AssocConst(_)))
    {
        return None;
    }
    let named: Vec<(String, String)> = a
        .args
        .iter()
        .filter_map(|g| match g {
            GenericArgument::AssocConst(c) => Some((c.ident.to_string(), text(&c.value))),
            _ => None,
        })
        .collect();
    let in_order: Option<Vec<&str>> = params
        .iter()
        .map(|p| named.iter().find(|(n, _)| p == n).map(|(_, v)| v.as_str()))
        .collect();
    let order = params
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let write = match in_order {
        Some(values) if named.len() == a.args.len() && values.len() == named.len() => {
            format!("`{model}<{}>`", values.join(", "))
        }
        _ => format!("`{model}<..>` with a value for each of {order}, in that order"),
    };
    Some(syn::Error::new_spanned(
        a,
        format!(
            "a model's sizes are given in order, without names: write {write} (the sizes of `{model}` are {order}); rustc also reports the named form as unstable associated-const equality (E0658)"
        ),
    ))
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
    /// The top model's size expressions and the numbers they came out as.
    written: Vec<(u64, String)>,
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
            written: Vec::new(),
        };
        subst.visit_item_struct_mut(&mut item);
        subst.visit_item_impl_mut(&mut imp);
        self.errors.extend(subst.errors);
        // The numbers of the model being checked (not of its parts, whose sizes have
        // names of their own), for messages.
        if self.making.len() == 1 {
            self.written = subst.written;
        }
        if let syn::Fields::Named(named) = &mut item.fields {
            for f in named.named.iter_mut() {
                if crate::model::is_dynamic_field(f) {
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

/// What a variation's twin scales by instead of [`VARIED`], to tell the numbers of
/// sizes (which change) from the definition's literals (which do not) in messages.
const TWIN: u64 = 5;

/// What a twin scales every size by besides, so that a size left at its power 0 changes
/// too (prime to 3 and 5, so no relation of the sizes is lost).
const TWIN_WHOLE: u64 = 7;

/// Mistakes that the instance's numbers hide. A definition must hold for any sizes, but
/// it is checked at an instance's numbers, where sizes the code keeps apart may happen
/// to be equal: `q.matmul(k)` without the transpose checks when `T` equals `D / H`. So
/// a well-formed instance is checked again with its sizes varied, as a stand-in for
/// checking them as symbols: every size ×3 (sums, products and quotients keep their
/// relations, while sizes of different degree part: `T` from `D / H`), then the sizes
/// scaled by rising and by falling powers of 3 (`T` from `D`). A variation the
/// definition's own arithmetic rejects (an uneven `D / H`) says nothing and is skipped;
/// the first one whose bodies have shape mistakes gives them, with a note naming its
/// sizes. Run only for an instance without mistakes of its own; each variation costs
/// one lowering of the methods (no planning), so three at most.
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
    // Every size x3; then each size by a different power of 3, rising and falling
    // along the parameters, so that any two sizes part in one of them while a quotient
    // of the two stays whole in the other. Each with its twin in powers of 5, which
    // tells a size's numbers from the literals in the messages.
    let scaled = |power: &dyn Fn(usize) -> u32, by: u64| -> Vec<u64> {
        let whole = if by == TWIN { TWIN_WHOLE } else { 1 };
        values
            .iter()
            .enumerate()
            .map(|(i, v)| v.saturating_mul(whole * by.pow(power(i))))
            .collect()
    };
    let n = values.len() as u32;
    let mut powers: Vec<Box<dyn Fn(usize) -> u32>> = vec![Box::new(|_| 1)];
    if values.len() > 1 {
        powers.push(Box::new(|i| i as u32 + 1));
        powers.push(Box::new(move |i| n - i as u32));
    }
    for power in powers {
        let (varied, twin) = (scaled(&*power, VARIED), scaled(&*power, TWIN));
        let Some(mistakes) = mistakes_at(def, defs, &varied, &twin, &alias.ident, precision) else {
            continue;
        };
        let Some(first) = mistakes.first() else {
            continue;
        };
        let shown = |vals: &[u64]| sizes_shown(params, vals);
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

/// The shape mistakes of `def` with its sizes set to `values` (named `name`), found by
/// lowering its methods without planning, their numbers named as the size expressions
/// they came from ([`Symbols`]); `twin` is the same variation with its powers of 3 made
/// powers of 5, lowered too where its arithmetic allows, so a number that changes
/// between the two is known to be a size's even where the definition also writes it
/// as a literal (the `3` of `D / H` beside a literal `3`). `None` when those sizes are
/// refused by the definition's own arithmetic (an uneven `D / H`) or its parts do not
/// parse.
fn mistakes_at(
    def: &Def,
    defs: &[Def],
    values: &[u64],
    twin: &[u64],
    name: &Ident,
    precision: kiln_tensor::Precision,
) -> Option<Vec<syn::Error>> {
    let (mistakes, written) = lowered_at(def, defs, values, name, precision)?;
    if mistakes.is_empty() {
        return Some(mistakes);
    }
    let symbols = Symbols::new(written, def);
    let twin = lowered_at(def, defs, twin, name, precision).map(|(m, w)| {
        let singles: Vec<String> = m
            .iter()
            .flat_map(|e| e.clone())
            .map(|e| e.to_string())
            .collect();
        (singles, Symbols::new(w, def))
    });
    let mut k = 0;
    Some(
        mistakes
            .iter()
            .map(|e| {
                let mut out: Option<syn::Error> = None;
                for one in e.clone() {
                    let message = one.to_string();
                    let paired = twin.as_ref().and_then(|(singles, other)| {
                        symbols.text_paired(&message, singles.get(k)?, other)
                    });
                    k += 1;
                    let text = paired.unwrap_or_else(|| symbols.text(&message));
                    // The same span, start to end, with the message named.
                    let one = syn::Error::new_spanned(one.to_compile_error(), text);
                    match &mut out {
                        Some(all) => all.combine(one),
                        None => out = Some(one),
                    }
                }
                out.unwrap_or_else(|| e.clone())
            })
            .collect(),
    )
}

/// Each whole number a size expression came out as, with the expression (`D`,
/// `4 * D`).
type Written = Vec<(u64, String)>;

/// The shape mistakes of `def` at `values` as the lowering words them, and the size
/// expressions of `def` with the numbers they came out as.
fn lowered_at(
    def: &Def,
    defs: &[Def],
    values: &[u64],
    name: &Ident,
    precision: kiln_tensor::Precision,
) -> Option<(Vec<syn::Error>, Written)> {
    let mut inst = Instantiator {
        defs,
        made: Vec::new(),
        making: vec![name.clone()],
        errors: Vec::new(),
        written: Vec::new(),
    };
    let top = inst.instantiate(def, values, name, None, name.span())?;
    if !inst.errors.is_empty()
        || inst
            .made
            .iter()
            .chain([&top])
            .any(|d| crate::model::parse_fields(&d.item).is_err())
    {
        return None;
    }
    let mistakes = crate::impls::shape_mistakes(&top.item, &top.imp, &inst.made, precision)?;
    Some((mistakes, inst.written))
}

/// How a message of a definition checked at sizes other than the user's (stand-ins,
/// or an instance's varied) names its numbers: each number that one size expression of
/// the definition came out as is shown as that expression (`Linear<4 * D, D>`,
/// `[B, T, D / H]`), an element count as a product (`H*64`), so no stand-in reads as
/// the user's. A number two expressions gave stays a number, and so does one the
/// definition also writes as a literal, unless a twin run at other sizes shows it to
/// be a size's.
struct Symbols {
    /// Each number one size expression gave, that no literal of the definition wrote.
    names: std::collections::HashMap<u64, String>,
    /// Each number one size expression gave, literal or not.
    any: std::collections::HashMap<u64, String>,
    /// The definition's own numbers.
    literals: std::collections::HashSet<u64>,
}

/// A piece of a message: text, or a whole number standing on its own (not inside a
/// word, not a rank-2 or 2^40).
enum Piece {
    Text(String),
    Number(String),
}

/// `message` cut into text and whole numbers.
fn pieces(message: &str) -> Vec<Piece> {
    let chars: Vec<char> = message.chars().collect();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let in_word = i > 0 && (word(chars[i - 1]) || matches!(chars[i - 1], '-' | '^'));
        if !c.is_ascii_digit() || in_word {
            text.push(c);
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        let digits: String = chars[start..i].iter().collect();
        if i < chars.len() && (word(chars[i]) || chars[i] == '.') {
            text.push_str(&digits);
            continue;
        }
        out.push(Piece::Text(std::mem::take(&mut text)));
        out.push(Piece::Number(digits));
    }
    out.push(Piece::Text(text));
    out
}

impl Symbols {
    fn new(written: Vec<(u64, String)>, def: &Def) -> Self {
        let literals = literals_of(def);
        // A count (`L` in `[Block; L]`) is a small number that messages use for other
        // things (arguments, axes): left as a number.
        let counts: Vec<String> = match size_params(&def.item.generics) {
            Ok(params) => {
                let counted = counted_sizes(&def.item, &params);
                params
                    .iter()
                    .zip(counted)
                    .filter(|(_, c)| *c)
                    .map(|(p, _)| p.to_string())
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        let mut any = std::collections::HashMap::new();
        let mut clashing = std::collections::HashSet::new();
        for (v, w) in written.into_iter().filter(|(_, w)| !counts.contains(w)) {
            if clashing.contains(&v) {
                continue;
            }
            match any.get(&v) {
                Some(prev) if *prev != w => {
                    any.remove(&v);
                    clashing.insert(v);
                }
                _ => {
                    any.insert(v, w);
                }
            }
        }
        let names = any
            .iter()
            .filter(|(v, _)| !literals.contains(v))
            .map(|(v, w)| (*v, w.clone()))
            .collect();
        Symbols {
            names,
            any,
            literals,
        }
    }

    /// How a number is shown: the size expression it came out as; else, for a number
    /// above the stand-ins' base, a product of such an expression and another one or a
    /// small literal (an element count, `H*64`); else `None` (the number). `sure`: the
    /// number is known to be a size's, even where a literal of the definition is too.
    fn show(&self, v: u64, sure: bool) -> Option<String> {
        let names = if sure { &self.any } else { &self.names };
        if let Some(name) = names.get(&v) {
            return Some(name.clone());
        }
        if v <= STAND_IN_BASE || (!sure && self.literals.contains(&v)) {
            return None;
        }
        let factor = |w: &str| match w.contains(' ') {
            true => format!("({w})"),
            false => w.to_string(),
        };
        let mut by_size: Vec<(u64, &String)> = names
            .iter()
            .filter(|(n, _)| **n > 1)
            .map(|(n, w)| (*n, w))
            .collect();
        by_size.sort();
        for (n, w) in by_size.into_iter().rev() {
            if !v.is_multiple_of(n) {
                continue;
            }
            let q = v / n;
            if let Some(other) = names.get(&q) {
                return Some(format!("{}*{}", factor(w), factor(other)));
            }
            if q < STAND_IN_BASE || self.literals.contains(&q) {
                return Some(format!("{}*{q}", factor(w)));
            }
        }
        None
    }

    /// `message` with each whole number that is a size expression's value written as
    /// that expression.
    fn text(&self, message: &str) -> String {
        pieces(message)
            .into_iter()
            .map(|p| match p {
                Piece::Text(t) => t,
                Piece::Number(d) => d
                    .parse()
                    .ok()
                    .and_then(|v| self.show(v, false))
                    .unwrap_or(d),
            })
            .collect()
    }

    /// `message` named by comparing it with `twin`, the same message at other sizes
    /// (named by `other`): a number that is the same in both is the user's, one that
    /// differs is a size's and is named. `None` when the two are not the same message.
    fn text_paired(&self, message: &str, twin: &str, other: &Symbols) -> Option<String> {
        let (mine, theirs) = (pieces(message), pieces(twin));
        if mine.len() != theirs.len() {
            return None;
        }
        let mut out = String::new();
        for (a, b) in mine.into_iter().zip(theirs) {
            match (a, b) {
                (Piece::Text(a), Piece::Text(b)) if a == b => out.push_str(&a),
                // The same at both sizes: the user's number, unless it is one the
                // definition writes nowhere as a literal and one size expression gave.
                (Piece::Number(a), Piece::Number(b)) if a == b => {
                    let named = a.parse().ok().and_then(|v| self.show(v, false));
                    out.push_str(&named.unwrap_or(a));
                }
                (Piece::Number(a), Piece::Number(b)) => {
                    let (x, y): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                    let named = self.show(x, true).or_else(|| other.show(y, true));
                    out.push_str(&named.unwrap_or(a));
                }
                _ => return None,
            }
        }
        Some(out)
    }
}

/// Every whole number written as a literal in a definition (its struct and impl).
fn literals_of(def: &Def) -> std::collections::HashSet<u64> {
    fn walk(ts: TokenStream, out: &mut std::collections::HashSet<u64>) {
        for t in ts {
            match t {
                proc_macro2::TokenTree::Group(g) => walk(g.stream(), out),
                proc_macro2::TokenTree::Literal(l) => {
                    if let Ok(syn::Lit::Int(i)) = syn::parse_str::<syn::Lit>(&l.to_string()) {
                        if let Ok(v) = i.base10_parse::<u64>() {
                            out.insert(v);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = std::collections::HashSet::new();
    walk(def.item.to_token_stream(), &mut out);
    walk(def.imp.to_token_stream(), &mut out);
    out
}

/// The size a stand-in gives a count (`L` in `blocks: [Block<D>; L]`): two parts, so
/// that one part's output feeds the next, without lowering many of them.
const STAND_IN_COUNT: u64 = 2;

/// The smallest stand-in for a size: a multiple of 64, so that halves down to
/// sixty-fourths (`D / 2`, `D / 8`) stay whole, and as wide as the windows of a
/// convolution stack over an image of that side (a stand-in smaller than what the
/// definition's layers need would be a mistake of the stand-in, not of the definition).
const STAND_IN_BASE: u64 = 64;

/// The bases tried for stand-ins, in order: multiples of [`STAND_IN_BASE`] by factors
/// prime to 3 (so the powers of 3 that vary them keep every size apart).
const STAND_IN_BASES: [u64; 4] = [
    STAND_IN_BASE,
    5 * STAND_IN_BASE,
    7 * STAND_IN_BASE,
    11 * STAND_IN_BASE,
];

/// Shape mistakes a definition holds whatever its sizes, found where it is written,
/// before any instance (a library may hold definitions that only its users
/// instantiate). The definition is checked at stand-in sizes, as its instances are
/// checked with theirs varied: `64 * 3^k` by falling powers along the parameters (every
/// two sizes part, and a quotient of an earlier size by a later one stays whole), else
/// by rising ones, else all equal; a count (an array's length) is 2. Where the
/// definition writes one of those numbers itself, the base 64 gives way to 320, 448 or
/// 704. The first stand-in the definition's own arithmetic allows is the check: its
/// mistakes are reported with its numbers named as the size expressions they came from
/// ([`Symbols`]) and a note naming its sizes.
pub(crate) fn definition_mistakes(def: &Def, defs: &[Def]) -> Option<Vec<TokenStream>> {
    let params = size_params(&def.item.generics).ok()?;
    if params.is_empty() || def.broken {
        return None;
    }
    let counts = counted_sizes(&def.item, &params);
    let sized: Vec<usize> = (0..params.len()).filter(|i| !counts[*i]).collect();
    let m = sized.len() as u32;
    // Bases whose stand-ins are no number written in the definition come first, so a
    // message's numbers can be told apart (`Linear<64, D>`); the others stay, last, for
    // a definition whose arithmetic only they allow.
    let literals = literals_of(def);
    let mut bases = STAND_IN_BASES.to_vec();
    bases.sort_by_key(|b| (0..=m.max(1)).any(|p| literals.contains(&(b * VARIED.pow(p)))));
    // Each stand-in with its twin in powers of 5 (see `mistakes_at`).
    let mut stand_ins = Vec::new();
    for base in bases {
        let stand_in = |power: &dyn Fn(u32) -> u32, by: u64| -> Vec<u64> {
            (0..params.len())
                .map(|i| match sized.iter().position(|&j| j == i) {
                    None => STAND_IN_COUNT,
                    Some(k) if by == TWIN => TWIN_WHOLE * base * by.pow(power(k as u32)),
                    Some(k) => base * by.pow(power(k as u32)),
                })
                .collect()
        };
        let (falling, rising, equal) = (|k| m - 1 - k, |k| k, |_| 1);
        let mut powers: Vec<&dyn Fn(u32) -> u32> = vec![&falling];
        if m > 1 {
            powers.push(&rising);
            powers.push(&equal);
        }
        for power in powers {
            stand_ins.push((stand_in(power, VARIED), stand_in(power, TWIN)));
        }
    }
    let name = &def.item.ident;
    for (values, twin) in stand_ins {
        let Some(mistakes) =
            mistakes_at(def, defs, &values, &twin, name, kiln_tensor::Precision::F32)
        else {
            continue;
        };
        // One stand-in the arithmetic allows is the check; instances vary their own
        // sizes further.
        if mistakes.is_empty() {
            return None;
        }
        let shown = sizes_shown(&params, &values);
        let note = format!(
            " (in the definition of `{name}`, checked with the stand-in sizes {shown}: a definition must hold for any sizes)"
        );
        let mut seen = std::collections::HashSet::new();
        return Some(
            mistakes
                .iter()
                .filter(|e| seen.insert(e.to_string()))
                .map(|e| errors_in(e, &note))
                .collect(),
        );
    }
    None
}

/// `D = 192, H = 64`: sizes named, for messages.
fn sizes_shown(params: &[Ident], values: &[u64]) -> String {
    params
        .iter()
        .zip(values)
        .map(|(p, v)| format!("{p} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which of `params` are counts: a size written in an array field's length.
fn counted_sizes(item: &syn::ItemStruct, params: &[Ident]) -> Vec<bool> {
    fn lengths(ty: &Type, out: &mut Vec<String>) {
        if let Type::Array(a) = ty {
            out.extend(a.len.to_token_stream().into_iter().map(|t| t.to_string()));
            lengths(&a.elem, out);
        }
    }
    let mut words = Vec::new();
    for f in &item.fields {
        lengths(&f.ty, &mut words);
    }
    params
        .iter()
        .map(|p| words.iter().any(|w| p == w))
        .collect()
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
    // A definition that reported mistakes of its own (found at stand-in sizes, say)
    // still expands at these numbers, so that the instance's callers compile; its
    // instances repeat none of its mistakes, and report only their numbers' own.
    let quiet = def.broken;
    let params = size_params(&def.item.generics).unwrap_or_default();
    if let Some(e) = named_sizes(target, &name, &params) {
        return fail(e);
    }
    let mut errors = Vec::new();
    let Some(values) = literal_args(target, &mut errors) else {
        return errors.into_iter().map(fail).collect();
    };
    let hidden = format_ident!("__kiln_{}", alias.ident);
    let mut inst = Instantiator {
        defs: &defs,
        made: Vec::new(),
        making: vec![alias.ident.clone()],
        errors,
        written: Vec::new(),
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
            if let Err(e) = crate::model::parse_fields(&d.item) {
                inst.errors.extend(e);
            }
        }
    }
    if !inst.errors.is_empty() || top.is_none() {
        // One message per mistake: an uneven `D / H` is reported where it is first
        // met, not at each of its uses. These are the instance's own (its numbers'
        // arithmetic), reported even when the definition reported mistakes of its own.
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
    // The nested models hold the int8 forms of their layers too; a loss scale is the
    // top model's alone.
    let parts_precision = match precision {
        kiln_tensor::Precision::Int8 => precision,
        _ => kiln_tensor::Precision::F32,
    };
    let parts = inst.made.iter().map(|d| {
        crate::structs::expand_struct(d.item.clone(), parts_precision)
            .unwrap_or_else(|e| e.to_compile_error())
    });
    let top_struct = crate::structs::expand_struct(item.clone(), precision)
        .unwrap_or_else(|e| e.to_compile_error());
    let mistakes = match quiet {
        true => Mistakes::Silent,
        false => Mistakes::Reported(&context),
    };
    let (top_impl, clean) =
        crate::impls::expand_impl_in(item, top.imp, inst.made.clone(), mistakes, precision);
    // Reported beside a working expansion: the model runs at these numbers, and its
    // callers get no errors of their own.
    let coincidences: TokenStream = (clean && !quiet)
        .then(|| coincidences(def, &defs, &values, &params, &alias, precision))
        .flatten()
        .map(|(mistakes, note)| {
            let context = format!("{note}{context}");
            mistakes.iter().map(|e| errors_in(e, &context)).collect()
        })
        .unwrap_or_default();
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
