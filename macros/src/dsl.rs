//! The model DSL's types: `Tensor<B, 784>` (dims as generic arguments, an optional
//! dtype last, plain `Tensor` for a scalar) and layer fields (`Linear<784, 128>`,
//! arrays of layers `[Linear<64, 64>; 4]`), parsed into specs and written back as
//! the real types.

use kiln_tensor::nn::LayerSpec;
use kiln_tensor::DType;
use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Expr, GenericArgument, Ident, PathArguments, Type};

/// One dim as written in a tensor type.
#[derive(Clone, Debug)]
pub enum DimTok {
    /// A literal size.
    Lit(usize),
    /// A const generic parameter of the method.
    Param(Ident),
    /// `Dyn`: a size known at run time.
    Dyn,
}

/// A tensor type as written in a signature.
#[derive(Clone, Debug)]
pub struct TensorTy {
    /// The dims.
    pub dims: Vec<DimTok>,
    /// The element type.
    pub dtype: DType,
}

impl TensorTy {
    /// The real type: `::kiln::tensor::Tensor<Be, (Const<B>, Const<784>), f32>`.
    pub fn real_type(&self) -> TokenStream {
        let dims = self.dims.iter().map(|d| match d {
            DimTok::Lit(n) => {
                let n = proc_macro2::Literal::usize_unsuffixed(*n);
                quote!(::kiln::tensor::Const<#n>)
            }
            DimTok::Param(p) => quote!(::kiln::tensor::Const<#p>),
            DimTok::Dyn => quote!(::kiln::tensor::Dyn),
        });
        let e = dtype_type(self.dtype);
        quote!(::kiln::tensor::Tensor<Be, (#(#dims,)*), #e>)
    }
}

/// The Rust type of a dtype's elements.
pub fn dtype_type(d: DType) -> TokenStream {
    match d {
        DType::F32 => quote!(f32),
        DType::F64 => quote!(f64),
        DType::F16 => quote!(::kiln::tensor::f16),
        DType::BF16 => quote!(::kiln::tensor::bf16),
        DType::I32 => quote!(i32),
        DType::U32 => quote!(u32),
        DType::Bool => quote!(bool),
        DType::I8 => quote!(i8),
    }
}

/// The dtype named by an identifier, if it names one.
pub fn dtype_named(s: &str) -> Option<DType> {
    DType::ALL.iter().copied().find(|d| d.name() == s)
}

/// An integer literal, or a constant expression of literals (`{ 4 * 32 }`), as a size.
fn int_literal(e: &Expr) -> Option<usize> {
    match crate::arith::const_int(e)? {
        Ok(v) => usize::try_from(v).ok(),
        Err(_) => None,
    }
}

pub use crate::arith::MAX_SIZE;

/// One size argument of a layer type: an integer literal, not absurd, and not zero
/// unless `may_be_zero` (a convolution's padding).
fn layer_size(arg: &GenericArgument, may_be_zero: bool) -> syn::Result<usize> {
    let err = |m: String| Err(syn::Error::new(arg.span(), m));
    match arg {
        GenericArgument::Const(e) => match crate::arith::const_int(e) {
            Some(Ok(0)) if may_be_zero => Ok(0),
            Some(Ok(n)) if (1..=MAX_SIZE as i128).contains(&n) => Ok(n as usize),
            Some(Ok(0)) => err("a size is at least 1".into()),
            Some(Ok(n)) if n < 0 => err(format!("the size {n} is negative")),
            Some(Ok(n)) => err(format!(
                "the size {n} is too large: sizes are at most 2^40 ({MAX_SIZE})"
            )),
            Some(Err(m)) => err(m),
            None => err("layer sizes are whole numbers or the model's sizes, like `Linear<784, 128>` or `Linear<D, { 4 * D }>`".into()),
        },
        GenericArgument::Type(Type::Path(p)) if p.path.get_ident().is_some() => err(format!(
            "`{0}` is not a size of this model: the macro cannot read a `const` item; make it one, `struct Model<const {0}: usize>`, fixed by an instance (`#[model] type Name = Model<128>;`), or write its value",
            p.path.get_ident().expect("checked")
        )),
        _ => err("layer sizes are whole numbers or the model's sizes, like `Linear<784, 128>` or `Linear<D, { 4 * D }>`".into()),
    }
}

/// Parses `Tensor<...>`; `Ok(None)` when `ty` is not a `Tensor` type at all.
pub fn parse_tensor_type(ty: &Type, consts: &[Ident]) -> syn::Result<Option<TensorTy>> {
    let Type::Path(tp) = ty else { return Ok(None) };
    if tp.qself.is_some() || tp.path.segments.len() != 1 {
        return Ok(None);
    }
    let seg = &tp.path.segments[0];
    if seg.ident != "Tensor" {
        return Ok(None);
    }
    let args: Vec<&GenericArgument> = match &seg.arguments {
        PathArguments::None => vec![],
        PathArguments::AngleBracketed(a) => a.args.iter().collect(),
        PathArguments::Parenthesized(p) => {
            return Err(syn::Error::new(
                p.span(),
                "write a tensor type as `Tensor<B, 784>` (dims, then an optional dtype)",
            ))
        }
    };
    let mut dims = Vec::new();
    let mut dtype = DType::F32;
    for (i, arg) in args.iter().enumerate() {
        let last = i + 1 == args.len();
        match arg {
            GenericArgument::Const(e) => match int_literal(e) {
                Some(n) if n <= MAX_SIZE => dims.push(DimTok::Lit(n)),
                _ if matches!(e, Expr::Lit(l) if matches!(l.lit, syn::Lit::Int(_))) => {
                    return Err(syn::Error::new(
                        e.span(),
                        format!("this dim is too large: sizes are at most 2^40 ({MAX_SIZE})"),
                    ))
                }
                _ => {
                    return Err(syn::Error::new(
                        e.span(),
                        "a dim must be an integer literal, a const generic or `Dyn`",
                    ))
                }
            },
            GenericArgument::Type(Type::Path(p))
                if p.qself.is_none()
                    && p.path.segments.len() == 1
                    && p.path.segments[0].arguments.is_none() =>
            {
                let id = &p.path.segments[0].ident;
                let name = id.to_string();
                if name == "Dyn" {
                    dims.push(DimTok::Dyn);
                } else if let Some(d) = dtype_named(&name) {
                    if !last {
                        return Err(syn::Error::new(
                            id.span(),
                            format!("the dtype `{name}` must come last: `Tensor<dims.., {name}>`"),
                        ));
                    }
                    dtype = d;
                } else if consts.iter().any(|c| c == id) {
                    dims.push(DimTok::Param(id.clone()));
                } else {
                    return Err(syn::Error::new(
                        id.span(),
                        format!("unknown dim `{name}`: declare it as a const generic of the method (`const {name}: usize`), or use a literal or `Dyn`"),
                    ));
                }
            }
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "a dim must be an integer literal, a const generic or `Dyn`",
                ))
            }
        }
    }
    if dims.len() > MAX_RANK {
        return Err(syn::Error::new(
            ty.span(),
            format!(
                "tensor types have rank 0 to {MAX_RANK}; this one has {}",
                dims.len()
            ),
        ));
    }
    Ok(Some(TensorTy { dims, dtype }))
}

/// A field of a model struct.
#[derive(Clone, Debug)]
pub enum FieldKind {
    /// A built-in layer.
    Layer(LayerSpec),
    /// Another `#[model]`, by the path written in the field (`Block`, `blocks::Block`).
    Model(syn::Path),
    /// An array of `n` of the same thing.
    Array(Box<FieldKind>, usize),
    /// A module on the dynamic path (a `#[dynamic]` field), by its path: the plan calls
    /// out to it, its output shape declared at the call.
    Dynamic(syn::Path),
    /// A learned tensor of these dims, held without a layer (`Param<1, 1, 128>`).
    Param(Vec<usize>),
}

impl FieldKind {
    /// The real field type in a model of `precision` (an int8 instance holds the int8
    /// form of each layer whose weights the policy quantises).
    pub fn real_type_in(&self, precision: kiln_tensor::Precision) -> TokenStream {
        match self {
            FieldKind::Layer(spec) => layer_type_in(spec, precision),
            FieldKind::Model(path) | FieldKind::Dynamic(path) => model_type(path),
            FieldKind::Param(dims) => {
                let dims = dims
                    .iter()
                    .map(|&n| proc_macro2::Literal::usize_unsuffixed(n));
                quote!(::kiln::tensor::nn::Param<Be, (#(::kiln::tensor::Const<#dims>,)*)>)
            }
            FieldKind::Array(inner, n) => {
                let t = inner.real_type_in(precision);
                let n = proc_macro2::Literal::usize_unsuffixed(*n);
                quote!([#t; #n])
            }
        }
    }
}

/// The type of a nested model: its path with the backend parameter, `Block<Be>`.
pub fn model_type(path: &syn::Path) -> TokenStream {
    let mut p = path.clone();
    if let Some(last) = p.segments.last_mut() {
        last.arguments = PathArguments::AngleBracketed(syn::parse_quote!(<Be>));
    }
    quote!(#p)
}

/// The name a nested model goes by in messages and as a definition's key: the last
/// segment of its path.
pub fn model_name(path: &syn::Path) -> String {
    path.segments
        .last()
        .map(|s| s.ident.to_string())
        .unwrap_or_default()
}

/// The type of a built-in layer in a model of `precision`: its int8 form
/// (`kiln_tensor::nn::LinearInt8`) where the policy holds its weight as int8.
pub fn layer_type_in(spec: &LayerSpec, precision: kiln_tensor::Precision) -> TokenStream {
    let int8 = spec
        .params_in(precision)
        .iter()
        .any(|p| p.dtype == DType::I8);
    let l = |n: usize| proc_macro2::Literal::usize_unsuffixed(n);
    match *spec {
        LayerSpec::Linear { inputs, outputs } if int8 => {
            let (i, o) = (l(inputs), l(outputs));
            quote!(::kiln::tensor::nn::LinearInt8<Be, #i, #o>)
        }
        LayerSpec::Embedding { vocab, features } if int8 => {
            let (v, d) = (l(vocab), l(features));
            quote!(::kiln::tensor::nn::EmbeddingInt8<Be, #v, #d>)
        }
        _ => layer_type(spec),
    }
}

/// The runtime type of a layer spec, with every const argument spelled out.
pub fn layer_type(spec: &LayerSpec) -> TokenStream {
    let l = |n: usize| proc_macro2::Literal::usize_unsuffixed(n);
    match *spec {
        LayerSpec::Linear { inputs, outputs } => {
            let (i, o) = (l(inputs), l(outputs));
            quote!(::kiln::tensor::nn::Linear<Be, #i, #o>)
        }
        LayerSpec::Conv2d {
            inputs,
            outputs,
            kernel,
            stride,
            padding,
            groups,
        } => {
            let a = [inputs, outputs, kernel, stride, padding, groups].map(l);
            quote!(::kiln::tensor::nn::Conv2d<Be, #(#a),*>)
        }
        LayerSpec::MaxPool2d { kernel, stride } => {
            let (k, s) = (l(kernel), l(stride));
            quote!(::kiln::tensor::nn::MaxPool2d<Be, #k, #s>)
        }
        LayerSpec::AvgPool2d { kernel, stride } => {
            let (k, s) = (l(kernel), l(stride));
            quote!(::kiln::tensor::nn::AvgPool2d<Be, #k, #s>)
        }
        LayerSpec::BatchNorm2d { channels } => {
            let c = l(channels);
            quote!(::kiln::tensor::nn::BatchNorm2d<Be, #c>)
        }
        LayerSpec::LayerNorm { features } => {
            let f = l(features);
            quote!(::kiln::tensor::nn::LayerNorm<Be, #f>)
        }
        LayerSpec::Embedding { vocab, features } => {
            let (v, f) = (l(vocab), l(features));
            quote!(::kiln::tensor::nn::Embedding<Be, #v, #f>)
        }
        LayerSpec::Dropout { percent } => {
            let p = l(percent);
            quote!(::kiln::tensor::nn::Dropout<Be, #p>)
        }
        LayerSpec::Flatten => quote!(::kiln::tensor::nn::Flatten<Be>),
    }
}

/// The built-in layer whose name `name` misspells (one or two edits away), if any.
fn near_layer_name(name: &str) -> Option<&'static str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    LayerSpec::NAMES
        .iter()
        .copied()
        .find(|l| *l != name && distance(&name.to_lowercase(), &l.to_lowercase()) <= 2)
}

/// Whether a field type's path names another model: not a built-in layer (nor its
/// misspelling) and not a standard collection.
pub fn names_model(path: &syn::Path) -> bool {
    match path.segments.len() {
        0 => false,
        1 => {
            let name = path.segments[0].ident.to_string();
            !(LayerSpec::NAMES.contains(&name.as_str())
                || name == PARAM
                || is_collection(&name)
                || near_layer_name(&name).is_some())
        }
        _ => true,
    }
}

/// The name of a learned-tensor field's type.
const PARAM: &str = "Param";

/// The rank a tensor type or a learned tensor may have at most.
const MAX_RANK: usize = 6;

/// Parses the dims of `Param<1, 1, 128>`: sizes as layers take them (literals or the
/// model's sizes), fixed at build time.
fn param_dims(ty: &Type, args: &PathArguments) -> syn::Result<Vec<usize>> {
    let args: Vec<&GenericArgument> = match args {
        PathArguments::None => vec![],
        PathArguments::AngleBracketed(a) => a.args.iter().collect(),
        PathArguments::Parenthesized(p) => {
            return Err(syn::Error::new(
                p.span(),
                "write a learned tensor as `Param<1, 1, 128>`: its dims as generic arguments",
            ))
        }
    };
    if args.len() > MAX_RANK {
        return Err(syn::Error::new(
            ty.span(),
            format!(
                "a learned tensor has rank 0 to {MAX_RANK}; this one has {}",
                args.len()
            ),
        ));
    }
    let mut dims = Vec::new();
    for arg in args {
        match arg {
            GenericArgument::Type(Type::Path(p)) if p.path.is_ident("Dyn") => {
                return Err(syn::Error::new(
                    arg.span(),
                    "a learned tensor's dims are fixed when the model is built: `Dyn` cannot be one; write a number or one of the model's sizes",
                ))
            }
            GenericArgument::Type(Type::Path(p))
                if p.path.get_ident().and_then(|i| dtype_named(&i.to_string())).is_some() =>
            {
                return Err(syn::Error::new(
                    arg.span(),
                    "a learned tensor is stored in f32 (a model's `precision` casts it where its ops run in bf16 or f16): write only its dims",
                ))
            }
            _ => dims.push(layer_size(arg, false)?),
        }
    }
    let count = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if count.is_none_or(|n| n > kiln_tensor::nn::spec::MAX_PARAM_ELEMENTS) {
        return Err(syn::Error::new(
            ty.span(),
            "this learned tensor would hold more than 2^40 elements",
        ));
    }
    Ok(dims)
}

/// Whether `name` is a standard collection (a field's layers must be fixed at build time).
fn is_collection(name: &str) -> bool {
    matches!(name, "Vec" | "VecDeque" | "Box" | "Option" | "HashMap")
}

/// Parses a field type: a built-in layer, another `#[model]`, or an array of them.
pub fn parse_field_type(ty: &Type) -> syn::Result<FieldKind> {
    match ty {
        Type::Array(a) => {
            let n = int_literal(&a.len).ok_or_else(|| {
                syn::Error::new(
                    a.len.span(),
                    "the length of an array of layers must be an integer literal",
                )
            })?;
            Ok(FieldKind::Array(Box::new(parse_field_type(&a.elem)?), n))
        }
        // A built-in layer's name misspelt (`Flaten`), not another model.
        Type::Path(p)
            if p.qself.is_none()
                && p.path.segments.len() == 1
                && near_layer_name(&p.path.segments[0].ident.to_string()).is_some() =>
        {
            let name = p.path.segments[0].ident.to_string();
            let near = near_layer_name(&name).unwrap_or_default();
            Err(syn::Error::new(
                ty.span(),
                format!("unknown layer type `{name}`; did you mean `{near}`? (the built-in layers are {}; a field may also hold another #[model])", LayerSpec::NAMES.join(", ")),
            ))
        }
        // A learned tensor.
        Type::Path(p)
            if p.qself.is_none()
                && p.path.segments.len() == 1
                && p.path.segments[0].ident == PARAM =>
        {
            Ok(FieldKind::Param(param_dims(
                ty,
                &p.path.segments[0].arguments,
            )?))
        }
        // Another model: a path naming no built-in layer, without arguments.
        Type::Path(p)
            if p.qself.is_none()
                && p.path.segments.iter().all(|s| s.arguments.is_none())
                && names_model(&p.path) =>
        {
            Ok(FieldKind::Model(p.path.clone()))
        }
        // A model with sizes, held by a model without: only an instance is a type.
        Type::Path(p) if p.qself.is_none() && names_model(&p.path) => {
            let name = model_name(&p.path);
            let shown = quote!(#p)
                .to_string()
                .replace(" < ", "<")
                .replace(" >", ">")
                .replace(" ,", ",");
            Err(syn::Error::new(
                ty.span(),
                format!("`{shown}` sets sizes of the model `{name}`: declare an instance, `#[model] type {name}Part = {shown};`, and hold that (or give this model sizes of its own: `struct Holder<const D: usize>`)"),
            ))
        }
        Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            let seg = &p.path.segments[0];
            let name = seg.ident.to_string();
            if is_collection(&name) {
                return Err(syn::Error::new(
                    ty.span(),
                    format!("a `{name}` of layers is not supported: a model's layers are fixed at build time; use an array, `[Linear<64, 64>; 4]`, and loop over it with `for layer in &self.field`"),
                ));
            }
            if !LayerSpec::NAMES.contains(&name.as_str()) {
                return Err(syn::Error::new(
                    seg.ident.span(),
                    format!(
                        "unknown layer type `{name}`; the built-in layers are {}",
                        LayerSpec::NAMES.join(", ")
                    ),
                ));
            }
            let mut args = Vec::new();
            match &seg.arguments {
                PathArguments::None => {}
                PathArguments::AngleBracketed(a) => {
                    for (i, arg) in a.args.iter().enumerate() {
                        // `Conv2d<IN, OUT, KERNEL, STRIDE, PADDING, GROUPS>`: no padding
                        // is 0.
                        let padding = name == "Conv2d" && i == 4;
                        args.push(layer_size(arg, padding)?);
                    }
                }
                PathArguments::Parenthesized(x) => {
                    return Err(syn::Error::new(
                        x.span(),
                        "expected a layer type like `Linear<784, 128>`",
                    ))
                }
            }
            LayerSpec::from_type(&name, &args)
                .map(FieldKind::Layer)
                .map_err(|m| syn::Error::new(ty.span(), m))
        }
        other => Err(syn::Error::new(
            other.span(),
            "expected a layer type like `Linear<784, 128>` or an array of layers",
        )),
    }
}
