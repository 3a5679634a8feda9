//! The parse phase: a `#[model]` struct and impl read into a model definition — its
//! fields (layers, nested models, learned tensors, dynamic parts), its methods'
//! signatures, its named sizes, and the definitions of the models it holds as their
//! definition macros hand them over. Every syntax mistake of a struct's fields is
//! collected into one error; nothing here builds a graph or writes code.

use crate::dsl::{parse_field_type, parse_tensor_type, FieldKind, TensorTy};
use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{
    Fields, FnArg, GenericParam, Generics, Ident, ImplItem, ImplItemFn, ItemImpl, ItemStruct, Pat,
    PathArguments, ReturnType, Type,
};

/// A parsed field.
pub struct ModelField {
    /// Its name.
    pub ident: Ident,
    /// What it holds.
    pub kind: FieldKind,
}

/// Parses the fields of a model struct, and checks that its nested models can be told
/// apart by name.
pub fn parse_fields(item: &ItemStruct) -> syn::Result<Vec<ModelField>> {
    let out = parse_field_types(item)?;
    one_model_per_name(&out)?;
    Ok(out)
}

/// Parses the fields of a model struct, each one's type on its own (what the struct
/// needs to be emitted with its fields).
pub fn parse_field_types(item: &ItemStruct) -> syn::Result<Vec<ModelField>> {
    if !item.generics.params.is_empty() {
        return Err(syn::Error::new(
            item.generics.span(),
            "a model with sizes has fields only in its instances",
        ));
    }
    let Fields::Named(named) = &item.fields else {
        return Err(syn::Error::new(
            item.span(),
            "a #[model] struct needs named fields, one per layer",
        ));
    };
    let mut out = Vec::new();
    let mut errors: Option<syn::Error> = None;
    for f in &named.named {
        let ident = f.ident.clone().expect("named fields have names");
        if f.attrs.iter().any(is_dynamic) {
            match dynamic_field(f) {
                Ok(kind) => out.push(ModelField { ident, kind }),
                Err(e) => match &mut errors {
                    Some(all) => all.combine(e),
                    None => errors = Some(e),
                },
            }
            continue;
        }
        match parse_field_type(&f.ty) {
            Ok(kind) => out.push(ModelField { ident, kind }),
            Err(e) => match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            },
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Nested models are found by name (a definition macro hands its model over by the
/// struct's name), so two fields naming two models of one name in two modules
/// (`encoder::Block`, `decoder::Block`) would both run the first one's body: refused,
/// naming both paths. A macro cannot resolve paths, so models are told apart by the
/// module written before the name: `Block` and `blocks::Block` may be one model (a
/// `use` brings it), `encoder::Block` and `decoder::Block` are taken to be two.
pub(crate) fn one_model_per_name(fields: &[ModelField]) -> syn::Result<()> {
    fn model_path(kind: &FieldKind) -> Option<&syn::Path> {
        match kind {
            FieldKind::Model(p) => Some(p),
            FieldKind::Array(inner, _) => model_path(inner),
            _ => None,
        }
    }
    let written = |p: &syn::Path| {
        let mut bare = p.clone();
        if let Some(last) = bare.segments.last_mut() {
            last.arguments = syn::PathArguments::None;
        }
        quote::quote!(#bare).to_string().replace(' ', "")
    };
    // The module segment written right before the model's name, if any.
    let module = |p: &syn::Path| {
        let n = p.segments.len();
        (n >= 2)
            .then(|| p.segments[n - 2].ident.to_string())
            .filter(|m| !matches!(m.as_str(), "crate" | "self" | "super"))
    };
    let mut seen: Vec<&syn::Path> = Vec::new();
    for f in fields {
        let Some(p) = model_path(&f.kind) else {
            continue;
        };
        let name = crate::dsl::model_name(p);
        if let Some(first) = seen.iter().find(|q| {
            crate::dsl::model_name(q) == name
                && matches!((module(q), module(p)), (Some(a), Some(b)) if a != b)
        }) {
            return Err(syn::Error::new_spanned(
                p,
                format!(
                    "two nested models named `{name}`: `{}` and `{}`; nested models are found by name, so give them different names (`{}` is already taken)",
                    written(first),
                    written(p),
                    name
                ),
            ));
        }
        seen.push(p);
    }
    Ok(())
}

/// Whether an attribute is `#[dynamic]`.
pub(crate) fn is_dynamic(a: &syn::Attribute) -> bool {
    a.path().is_ident("dynamic")
}

/// Whether a field is marked `#[dynamic]` (holds a module on the dynamic path).
pub(crate) fn is_dynamic_field(f: &syn::Field) -> bool {
    f.attrs.iter().any(is_dynamic)
}

/// A `#[dynamic]` field: a module on the dynamic path, named by a plain path (the
/// backend parameter is added, as for nested models).
pub(crate) fn dynamic_field(f: &syn::Field) -> syn::Result<FieldKind> {
    for a in f.attrs.iter().filter(|a| is_dynamic(a)) {
        a.meta
            .require_path_only()
            .map_err(|_| syn::Error::new_spanned(&a.meta, "`#[dynamic]` takes no arguments"))?;
    }
    match &f.ty {
        syn::Type::Path(p)
            if p.qself.is_none()
                && p.path.segments.iter().all(|s| s.arguments.is_none()) =>
        {
            Ok(FieldKind::Dynamic(p.path.clone()))
        }
        ty => Err(syn::Error::new(
            ty.span(),
            "a `#[dynamic]` field holds one dynamic module, named without generics (`router: Router`; the backend is added for you)",
        )),
    }
}

/// The last statement of a method's body, or its braces when it is empty: where a
/// result mismatch is reported.
pub(crate) struct FinalExpr<'m>(pub(crate) &'m MethodSig);

impl ToTokens for FinalExpr<'_> {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let b = &self.0.item.block;
        match b.stmts.last() {
            Some(s) => s.to_tokens(tokens),
            None => b.to_tokens(tokens),
        }
    }
}

/// A method of the `#[model] impl`, with its signature parsed.
#[derive(Clone)]
pub struct MethodSig {
    /// The method as written.
    pub item: ImplItemFn,
    /// Its const generic parameters.
    pub consts: Vec<Ident>,
    /// Its tensor arguments.
    pub args: Vec<(Ident, TensorTy)>,
    /// Its result (one tensor, or the elements of a tuple).
    pub ret: Vec<TensorTy>,
    /// Whether the result is a tuple.
    pub ret_tuple: bool,
}

impl MethodSig {
    /// The method's name.
    pub fn name(&self) -> &Ident {
        &self.item.sig.ident
    }

    /// Whether it returns one scalar (then it gets a `_and_grad` twin).
    pub fn is_scalar_loss(&self) -> bool {
        !self.ret_tuple
            && self.ret.len() == 1
            && self.ret[0].dims.is_empty()
            && self.ret[0].dtype.is_float()
    }
}

/// Parses a method's signature: `&self`, const generics, tensor arguments and result.
pub fn parse_method(item: &ImplItemFn) -> syn::Result<MethodSig> {
    let sig = &item.sig;
    let mut consts = Vec::new();
    for p in &sig.generics.params {
        match p {
            GenericParam::Const(c) => consts.push(c.ident.clone()),
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "model methods take only const generic parameters (`const B: usize`); the backend is `Be`",
                ))
            }
        }
    }
    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(r)) if r.reference.is_some() && r.mutability.is_none() => {}
        _ => {
            return Err(syn::Error::new(
                sig.span(),
                "model methods take `&self` first",
            ))
        }
    }
    let mut args = Vec::new();
    for a in inputs {
        let FnArg::Typed(pt) = a else {
            unreachable!("only the first argument can be self")
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(syn::Error::new(
                pt.pat.span(),
                "name each argument with a plain identifier",
            ));
        };
        let ty = parse_tensor_type(&pt.ty, &consts)?.ok_or_else(|| {
            syn::Error::new(
                pt.ty.span(),
                "model method arguments are tensors: `Tensor<B, 784>`",
            )
        })?;
        args.push((pi.ident.clone(), ty));
    }
    let (ret, ret_tuple) = match &sig.output {
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.span(),
                "a model method returns a tensor (or a tuple of tensors)",
            ))
        }
        ReturnType::Type(_, t) => match &**t {
            Type::Tuple(tt) => {
                let r = tt
                    .elems
                    .iter()
                    .map(|e| {
                        parse_tensor_type(e, &consts)?
                            .ok_or_else(|| syn::Error::new(e.span(), "expected a tensor type"))
                    })
                    .collect::<syn::Result<Vec<_>>>()?;
                (r, true)
            }
            t => (
                vec![parse_tensor_type(t, &consts)?.ok_or_else(|| {
                    syn::Error::new(t.span(), "expected a tensor type like `Tensor<B, 10>`")
                })?],
                false,
            ),
        },
    };
    Ok(MethodSig {
        item: item.clone(),
        consts,
        args,
        ret,
        ret_tuple,
    })
}

/// A nested model's definition, as its `#[model]` impl handed it over.
pub struct ModelDef {
    /// Its fields.
    pub fields: Vec<ModelField>,
    /// Its methods.
    pub methods: Vec<MethodSig>,
    /// Whether its own expansion reported mistakes (calls into it then report none).
    pub broken: bool,
}

/// The nested models' definitions, by name (the last segment of their path).
pub type Defs = HashMap<String, ModelDef>;

/// A nested model's definition as its definition macro hands it over:
/// `def { struct Block { .. } ; impl Block { .. } }`, or `broken_def { .. }` for a
/// model whose own expansion reported mistakes (calls into it report nothing more).
#[derive(Clone)]
pub struct Def {
    pub(crate) item: ItemStruct,
    pub(crate) imp: ItemImpl,
    pub(crate) broken: bool,
}

impl syn::parse::Parse for Def {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        let kw: Ident = input.parse()?;
        if kw != "def" && kw != "broken_def" {
            return Err(syn::Error::new(kw.span(), "expected `def { .. }`"));
        }
        let body;
        syn::braced!(body in input);
        let item = body.parse()?;
        body.parse::<syn::Token![;]>()?;
        let imp = body.parse()?;
        Ok(Def {
            item,
            imp,
            broken: kw == "broken_def",
        })
    }
}

impl quote::ToTokens for Def {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let (item, imp) = (&self.item, &self.imp);
        let kw = quote::format_ident!("{}", if self.broken { "broken_def" } else { "def" });
        tokens.extend(quote!(#kw { #item ; #imp }));
    }
}

/// The nested models' definitions, parsed (a definition with mistakes was reported by
/// its own expansion: what parses of it is kept).
pub(crate) fn parse_defs(defs: &[Def]) -> Defs {
    let mut out = Defs::new();
    for d in defs {
        let fields = parse_fields(&d.item).unwrap_or_default();
        let methods = d
            .imp
            .items
            .iter()
            .filter_map(|it| match it {
                ImplItem::Fn(f) => parse_method(f).ok(),
                _ => None,
            })
            .collect();
        out.insert(
            d.item.ident.to_string(),
            ModelDef {
                fields,
                methods,
                broken: d.broken,
            },
        );
    }
    out
}

/// The hidden method behind a typed one: `__kiln_<name>`, generic over the backend
/// only (sizes arrive at run time), so one copy serves every batch size.
pub(crate) fn raw_name(name: &Ident) -> Ident {
    quote::format_ident!("__kiln_{}", name)
}

/// The size parameters of a call, as `Programs::call` takes them: `&[("B", B)]`.
pub(crate) fn size_args(m: &MethodSig) -> TokenStream {
    let consts = &m.consts;
    let names = consts.iter().map(|c| c.to_string());
    quote!(&[#((#names, #consts)),*])
}

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
