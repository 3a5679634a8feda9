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
    let check = |values: &[u64]| mistakes_at(def, defs, values, &alias.ident, precision);
    // Every size x3; then each size by a different power of 3, rising and falling
    // along the parameters, so that any two sizes part in one of them while a quotient
    // of the two stays whole in the other.
    let scaled = |power: &dyn Fn(usize) -> u32| -> Vec<u64> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| v.saturating_mul(VARIED.pow(power(i))))
            .collect()
    };
    let n = values.len() as u32;
    let mut variations = vec![scaled(&|_| 1)];
    if values.len() > 1 {
        variations.push(scaled(&|i| i as u32 + 1));
        variations.push(scaled(&|i| n - i as u32));
    }
    for varied in variations {
        let Some(mistakes) = check(&varied) else {
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
/// lowering its methods without planning; `None` when those sizes are refused by the
/// definition's own arithmetic (an uneven `D / H`) or its parts do not parse.
fn mistakes_at(
    def: &Def,
    defs: &[Def],
    values: &[u64],
    name: &Ident,
    precision: kiln_tensor::Precision,
) -> Option<Vec<syn::Error>> {
    let mut inst = Instantiator {
        defs,
        made: Vec::new(),
        making: vec![name.clone()],
        errors: Vec::new(),
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
    crate::impls::shape_mistakes(&top.item, &top.imp, &inst.made, precision)
}

/// The size a stand-in gives a count (`L` in `blocks: [Block<D>; L]`): two parts, so
/// that one part's output feeds the next, without lowering many of them.
const STAND_IN_COUNT: u64 = 2;

/// The smallest stand-in for a size: a multiple of 64, so that halves down to
/// sixty-fourths (`D / 2`, `D / 8`) stay whole, and as wide as the windows of a
/// convolution stack over an image of that side (a stand-in smaller than what the
/// definition's layers need would be a mistake of the stand-in, not of the definition).
const STAND_IN_BASE: u64 = 64;

/// Shape mistakes a definition holds whatever its sizes, found where it is written,
/// before any instance (a library may hold definitions that only its users
/// instantiate). The definition is checked at stand-in sizes, as its instances are
/// checked with theirs varied: `64 * 3^k` by falling powers along the parameters (every
/// two sizes part, and a quotient of an earlier size by a later one stays whole), else
/// by rising ones, else all equal; a count (an array's length) is 2. The first stand-in
/// the definition's own arithmetic allows is the check: its mistakes are reported with
/// a note naming its sizes.
pub(crate) fn definition_mistakes(def: &Def, defs: &[Def]) -> Option<Vec<TokenStream>> {
    let params = size_params(&def.item.generics).ok()?;
    if params.is_empty() || def.broken {
        return None;
    }
    let counts = counted_sizes(&def.item, &params);
    let sized: Vec<usize> = (0..params.len()).filter(|i| !counts[*i]).collect();
    let m = sized.len() as u32;
    let stand_in = |power: &dyn Fn(u32) -> u32| -> Vec<u64> {
        (0..params.len())
            .map(|i| match sized.iter().position(|&j| j == i) {
                None => STAND_IN_COUNT,
                Some(k) => STAND_IN_BASE * VARIED.pow(power(k as u32)),
            })
            .collect()
    };
    let mut stand_ins = vec![stand_in(&|k| m - 1 - k)];
    if m > 1 {
        stand_ins.push(stand_in(&|k| k));
        stand_ins.push(stand_in(&|_| 1));
    }
    let name = &def.item.ident;
    for values in stand_ins {
        let Some(mistakes) = mistakes_at(def, defs, &values, name, kiln_tensor::Precision::F32)
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
