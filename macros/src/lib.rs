//! # kiln-macros
//!
//! Owns `#[model]`: parse → check (op IR built with the op and method tables' shape
//! rules) → gradients → fusion plans → Rust code.
//!
//! ## The phases, as files
//!
//! - **parse** — `model.rs`: a struct and impl read into a model definition (fields,
//!   method signatures, named sizes, the nested models' definitions), every syntax
//!   mistake of the fields collected into one error; `dsl.rs` reads tensor and layer
//!   types; `arith.rs` owns size arithmetic (what `{ 4 * D }` and `D / H` mean).
//! - **check** — `lower/`: each method body lowered to a graph (`graph.rs`) by the
//!   tables' rules, every independent mistake collected, worded in `lower/messages.rs`;
//!   `instances.rs` checks a definition at stand-in sizes where it is written, fixes its
//!   sizes at an instance and checks it again with its sizes varied.
//! - **emit** — `structs.rs` (the struct, its `Module` impl and the hand-over macros),
//!   `impls.rs` (typed shims over planned raw methods, `summary()`), `fuse.rs` (plans
//!   and native loops), `train.rs` (the backward pass and `<name>_and_grad`),
//!   `embed.rs` (`embed!`), `derive.rs` (`#[derive(Module)]`).
//!
//! Imports run one way, parse ← check ← emit: no module imports one that imports it.
//!
//! ## The grammar
//!
//! ```text
//! #[model] struct Name { field: Layer<sizes..>, blocks: [Layer<sizes..>; N], .. }
//! #[model] impl Name { fn method<const B: usize, ..>(&self, x: Tensor<dims..>, ..) -> Tensor<dims..> { body } .. }
//!
//! #[model] struct Gpt<const D: usize, const H: usize> { up: Linear<D, { 4 * D }>, blocks: [Block<D, H>; 4], .. }
//! #[model] impl Gpt { .. Tensor<B, T, D> .. reshape::<B, T, H, { D / H }>() .. x / ((D / H) as f32).sqrt() .. }
//! #[model] type GptSmall = Gpt<128, 4>;
//! ```
//!
//! - **Named sizes** (macros/src/instances.rs, macros/src/arith.rs): a struct's `const` parameters are its
//!   sizes, usable in its field types, its impl's signatures and bodies, with `+ - * /`
//!   (a division must come out even) and casts; a model with sizes is a definition,
//!   and each `#[model] type Name = Model<sizes..>;` (in any module or crate) is a model,
//!   expanded as if written with literals; its nested models with sizes are
//!   instantiated with it. Mistakes are reported at the instance, naming its sizes.
//!
//! - **Layers** (fields): `Linear<IN, OUT>`, `Conv2d<IN, OUT, K>` (then optional
//!   `STRIDE, PADDING, GROUPS`), `MaxPool2d<K>` / `AvgPool2d<K>` (optional `STRIDE`,
//!   default `K`), `BatchNorm2d<C>`, `LayerNorm<F>`, `Embedding<VOCAB, D>`,
//!   `Dropout<PERCENT>`, `Flatten`, other `#[model]`s (`block: Block`,
//!   `part: kiln_models::parts::ResidualMlp`: any path, from any module or crate,
//!   or a name brought in by `use`), and arrays of them `[Linear<64, 64>; 4]`,
//!   `[Block; 6]`. Sizes are whole numbers or the model's named sizes. The struct
//!   gets a backend parameter `Be`.
//! - **Learned tensors** (fields): `cls: Param<1, 1, D>` holds a trained tensor of
//!   those dims without a layer (`kiln_tensor::nn::Param`): read as a value in bodies
//!   (`x + self.cls`), named by its field in checkpoints (`cls`, `blocks.0.gate`),
//!   initialised normal with standard deviation 0.02, trained, and counted by
//!   `summary()`.
//! - **Tensor types**: `Tensor<B, 784>` lists the dims — integer literals, the
//!   method's const generics, or `Dyn` (a size checked at run time) — then an optional
//!   dtype (`f32` default, `f16`, `bf16`, `f64`, `i32`, `u32`, `bool`). Plain `Tensor`
//!   is a scalar. (`Tensor<[B, 784]>` cannot be used: rustc rejects it before any
//!   macro runs.)
//! - **Bodies**: `let` bindings (names, tuples, optional tensor type annotations that
//!   are checked), assignments, `for layer in &self.blocks { h = layer(h); }` over
//!   arrays of layers (unrolled), a final expression (a tensor or a tuple).
//! - **Expressions**: layer calls `self.fc1(x)` (or `self.fc1.forward(x)`,
//!   `self.blocks[2](x)`), calls of other methods of the impl `self.helper(x)`, calls
//!   of a nested model (`self.block(x)` is its `forward`, `self.block.delta(x)` any
//!   other method; both inlined for shape checking, fusion and differentiation, the
//!   arguments checked against the nested method's signature), `+ - * /` between tensors
//!   (NumPy broadcasting) or with numbers, unary `-`, and tensor methods: the float
//!   elementwise ops of the op table (`relu sigmoid tanh exp log sqrt ...`,
//!   `kiln_tensor::UnaryOp`) and every method of the method table
//!   (`kiln_tensor::Method`, declared in `kiln_tensor::for_each_method!`, whose rustdoc
//!   gives each one's form and meaning): `gelu() softmax() softmax(AXIS) sum::<AXIS>()
//!   reshape::<D0, D1>() cast::<bf16>() matmul(y) mse(y) concat::<AXIS>(y)
//!   cross_entropy(labels)` and the rest. Reductions drop the axis they reduce;
//!   `softmax`/`log_softmax` act on the last axis unless given one; `t()` swaps the
//!   last two axes of any rank; `mse` takes two tensors of one shape (no
//!   broadcasting); one size of a `reshape` may be `Dyn`, solved from the element count.
//!
//! ## What is generated
//!
//! For `struct Mlp`: `Mlp<Be: Backend>` with typed layer fields, `MlpGrads<Be>`
//! mirroring them, `impl Module<Be>` (named parameter visits, updates, checkpoints,
//! seeded `init`). Each method's body is lowered to a graph of the op table's
//! primitives (every shape checked symbolically) and planned by `kiln-fusion` at build
//! time; the macro embeds the plan's text as an associated const and writes a native
//! Rust loop for every distinct fused expression whose constants it knows (once per
//! model, in a hidden module). The method the user declared becomes a typed shim over
//! a hidden raw method, generic over the backend only, that runs the plan through the
//! model's program cache with the sizes given at run time: fused, or op by op (one
//! backend call per node) when `model.set_fused(false)` or when the plan's symbolic
//! dims do not describe the inputs. So a binary compiles each method once per backend,
//! not once per batch size. A method returning a scalar also gets `<name>_and_grad`,
//! returning the value and an `MlpGrads` computed by a backward pass derived at build
//! time and planned with the forward one. `Mlp::fusion_plans()`, `fusion_report()` and
//! `fusion_dot()` show the plans. A model whose impl has `loss(input, target)`
//! returning a scalar also implements `kiln::train::learner::Supervised`: its sizes are
//! read from the batch's dims (after checking them against the declaration) and the
//! raw methods run, so the `Learner` trains it at any batch size; `forward(input)`, where
//! there is one, gives the scores metrics read.
//!
//! A nested model's parameters are the holder's, named as PyTorch names them
//! (`blocks.0.up.weight`); its gradients come back through `Module::grads_from_raw`.
//! The holder's macro reads the nested model's definition through a hidden
//! `#[macro_export]` macro re-exported under the struct's own name (so the struct's
//! path, or a `use` of it, reaches both), which calls `model_impl!` again with the
//! definition appended, once per nested model not yet known; a definition carries its
//! own nested ones. A nested model whose expansion failed is marked so, and calls into
//! it report nothing more: the holder's methods that call it keep their signatures,
//! their training entries and `Supervised` (stubbed), so the one error is the nested
//! model's.
//!
//! Shape mistakes are errors on the exact sub-expression, naming both shapes; every
//! independent mistake of a method is reported, without a cascade. A `#[model] impl`
//! goes in the module of its `#[model] struct`, before or after it (the struct passes
//! its fields to the impl through a hidden `macro_rules!`, reached by path).
//! Checks a `Dyn` size leaves open at build time run when the method runs, on the
//! planned and the op-by-op path alike (see `kiln_tensor::Guard`).

mod arith;
mod derive;
mod dsl;
mod embed;
mod fuse;
mod graph;
mod impls;
mod instances;
mod lower;
mod model;
#[cfg(test)]
mod snapshot;
mod structs;
mod train;

use proc_macro::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Item, ItemImpl, ItemStruct, Token};

/// Implements `Module` for a hand-written dynamic module: a struct (generic over its
/// backend) of `Param`s, `Layer`s, `ModuleList`s and other derived modules;
/// `#[module(skip)]` marks fields without tensors.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(item: TokenStream) -> TokenStream {
    match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => derive::expand(input).unwrap_or_else(|e| e.to_compile_error()),
        Err(e) => e.to_compile_error(),
    }
    .into()
}

/// Marks a model: on a struct of layers, and on the impl holding its methods.
///
/// ```text
/// #[model] struct Mlp { fc1: Linear<784, 128>, fc2: Linear<128, 10> }
/// #[model] impl Mlp {
///     fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> { self.fc2(self.fc1(x).relu()) }
///     fn loss<const B: usize>(&self, x: Tensor<B, 784>, y: Tensor<B, i32>) -> Tensor { self.forward(x).cross_entropy(y) }
/// }
/// #[model] type Small = Gpt<128, 4>;           // an instance of a model with sizes
/// #[model(precision = bf16)] type SmallBf16 = Gpt<128, 4>;
/// #[model(precision = int8)] type MlpInt8 = Mlp;  // int8 weights, for inference
/// ```
///
/// Shapes are checked when the program compiles; each method becomes a planned,
/// fused method (evaluation mode), each scalar method also `<name>_and_grad`
/// (training mode), and a `loss(input, target)` makes the model trainable by
/// `kiln::train::learner::Learner`. An int8 instance holds each linear layer's and
/// embedding's weight as int8 with per-row scales (what `kiln-quantize` writes) and
/// runs their products as `matmul_int8`: it evaluates, and does not train. The grammar (fields, layers, signatures, bodies,
/// named sizes) is in this crate's documentation; the guide, with an example of every
/// construct, training and evaluation behaviour and translations from PyTorch, is
/// `docs/guide.md` in the repository, and every tensor method is in `docs/methods.md`.
#[proc_macro_attribute]
pub fn model(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = proc_macro2::TokenStream::from(attr);
    let item = match syn::parse::<Item>(item) {
        Ok(Item::Type(t)) if !attr.is_empty() => {
            return match syn::parse2::<PrecisionArg>(attr) {
                Ok(p) => instance(t, Some(p.0)),
                Err(e) => e.to_compile_error().into(),
            }
        }
        _ if !attr.is_empty() => {
            return syn::Error::new_spanned(
                attr,
                "#[model] takes an argument only on an instance, its precision: `#[model(precision = bf16)] type MlpBf16 = Mlp;`",
            )
            .to_compile_error()
            .into();
        }
        parsed => parsed,
    };
    match item {
        Ok(Item::Struct(s)) => structs::expand_struct(s, kiln_tensor::Precision::F32)
            .unwrap_or_else(|e| e.to_compile_error())
            .into(),
        Ok(Item::Impl(i)) => {
            let syn::Type::Path(tp) = &*i.self_ty else {
                return syn::Error::new_spanned(
                    &i.self_ty,
                    "#[model] impl needs a model struct name",
                )
                .to_compile_error()
                .into();
            };
            let name = match tp.path.segments.len() {
                1 if tp.qself.is_none() => &tp.path.segments[0].ident,
                _ => {
                    return syn::Error::new_spanned(
                        &i.self_ty,
                        "write `#[model] impl Name`, with the model's plain name",
                    )
                    .to_compile_error()
                    .into()
                }
            };
            let cb = structs::callback_name(name);
            quote::quote!(#cb! { #i }).into()
        }
        Ok(Item::Type(t)) => instance(t, None),
        Ok(other) => {
            syn::Error::new_spanned(other, "#[model] goes on a struct of layers, on its impl, and on an instance of a model with sizes (`type GptSmall = Gpt<128, 4>;`)")
                .to_compile_error()
                .into()
        }
        Err(e) => e.to_compile_error().into(),
    }
}

/// `#[model] type Name = Model<..>;`: handed to the model's definition macro, with the
/// instance's precision when one was given.
fn instance(t: syn::ItemType, precision: Option<kiln_tensor::Precision>) -> TokenStream {
    let syn::Type::Path(target) = &*t.ty else {
        return syn::Error::new_spanned(
            &t.ty,
            "an instance names a model with its sizes: `#[model] type GptSmall = Gpt<128, 4>;`",
        )
        .to_compile_error()
        .into();
    };
    let path = model::bare_path(&target.path);
    let precision = precision.map(|p| {
        let p = quote::format_ident!("{}", p.name());
        quote::quote!(precision #p)
    });
    quote::quote!(#path! { instance #precision { #t } }).into()
}

/// `precision = bf16`, the argument `#[model]` takes on an instance.
struct PrecisionArg(kiln_tensor::Precision);

impl Parse for PrecisionArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: syn::Ident = input.parse()?;
        if key != "precision" {
            return Err(syn::Error::new(
                key.span(),
                format!(
                    "`{key}` is not an argument of #[model]; an instance takes `precision = bf16`"
                ),
            ));
        }
        input.parse::<Token![=]>()?;
        let value: syn::Ident = input.parse()?;
        let precision = kiln_tensor::Precision::parse(&value.to_string())
            .map_err(|e| syn::Error::new(value.span(), lower::messages::describe(&e)))?;
        if !input.is_empty() {
            return Err(input.error("#[model] on an instance takes one argument, `precision = ..`"));
        }
        Ok(PrecisionArg(precision))
    }
}

// Parsed once per macro call: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
/// What reaches `model_impl!`: a struct and its impl (`#[model] impl`), or an instance
/// (`#[model] type`); then the definitions of nested models gathered so far.
enum ImplInput {
    Impl {
        item: ItemStruct,
        imp: ItemImpl,
        defs: Vec<model::Def>,
    },
    Instance {
        alias: syn::ItemType,
        precision: kiln_tensor::Precision,
        defs: Vec<model::Def>,
    },
    Embed {
        request: embed::EmbedRequest,
        defs: Vec<model::Def>,
    },
}

impl Parse for ImplInput {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(syn::Ident) && input.fork().parse::<syn::Ident>()? == "embed" {
            input.parse::<syn::Ident>()?;
            let body;
            syn::braced!(body in input);
            let request = body.parse()?;
            let mut defs = Vec::new();
            while !input.is_empty() {
                defs.push(input.parse()?);
            }
            return Ok(ImplInput::Embed { request, defs });
        }
        if input.peek(syn::Ident) && input.fork().parse::<syn::Ident>()? == "instance" {
            input.parse::<syn::Ident>()?;
            let mut precision = kiln_tensor::Precision::F32;
            if input.peek(syn::Ident) {
                input.parse::<syn::Ident>()?; // `precision`, written by `instance` above
                let name: syn::Ident = input.parse()?;
                precision = kiln_tensor::Precision::parse(&name.to_string())
                    .map_err(|e| syn::Error::new(name.span(), e.to_string()))?;
            }
            let body;
            syn::braced!(body in input);
            let alias = body.parse()?;
            let mut defs = Vec::new();
            while !input.is_empty() {
                defs.push(input.parse()?);
            }
            return Ok(ImplInput::Instance {
                alias,
                precision,
                defs,
            });
        }
        let item = input.parse()?;
        input.parse::<Token![;]>()?;
        let imp = input.parse()?;
        let mut defs = Vec::new();
        while !input.is_empty() {
            defs.push(input.parse()?);
        }
        Ok(ImplInput::Impl { item, imp, defs })
    }
}

/// Builds a safetensors checkpoint into the program, checked against a `#[model]`
/// when the program compiles: `kiln::embed!(Mlp, "weights/mlp.safetensors")`, the
/// path relative to the file that calls it (as `include_bytes!`), or a checkpoint a
/// build script wrote: `concat!(env!("OUT_DIR"), "/mlp.safetensors")`. A tensor the model
/// lacks or the file lacks, or of other dims or dtype, is a compile error naming it
/// and both sides. The value's `load::<B>(&device)` builds the model with the weights.
/// A file written by another tool (PyTorch's `save_file`) has no checksums to verify
/// when it loads: `kiln::embed!(Mlp, "torch.safetensors", foreign)`. An int8 checkpoint
/// (`kiln-quantize`'s) goes into an int8 instance, checked against the int8 weights and
/// scales it holds: `kiln::embed!(MlpInt8, "mlp-int8.safetensors")`.
#[proc_macro]
pub fn embed(input: TokenStream) -> TokenStream {
    let args = syn::parse_macro_input!(input as embed::EmbedArgs);
    embed::request(args, |written| {
        let path = std::path::Path::new(written);
        if path.is_absolute() {
            return written.to_string();
        }
        let base = proc_macro::Span::call_site()
            .local_file()
            .and_then(|f| f.parent().map(std::path::Path::to_path_buf))
            .or_else(|| std::env::var_os("CARGO_MANIFEST_DIR").map(Into::into))
            .unwrap_or_default();
        // `include_bytes!` reads a relative path from the calling file: hand it an
        // absolute one (rustc may name the calling file relative to its own folder).
        let cwd = std::env::current_dir().unwrap_or_default();
        cwd.join(base).join(path).to_string_lossy().into_owned()
    })
    .into()
}

/// Internal: the second half of `#[model] impl`, reached through the struct's hidden
/// callback macro with the struct's definition prepended, then through each nested
/// model's definition macro with that model's definition appended (`def { .. }`).
#[doc(hidden)]
#[proc_macro]
pub fn model_impl(input: TokenStream) -> TokenStream {
    model_impl_tokens(input.into()).into()
}

/// `model_impl!` on `proc_macro2` tokens (the snapshot tests call it directly).
fn model_impl_tokens(input: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    match syn::parse2::<ImplInput>(input) {
        Ok(ImplInput::Impl { item, imp, defs }) => impls::expand_impl(item, imp, defs),
        Ok(ImplInput::Instance {
            alias,
            precision,
            defs,
        }) => instances::expand_instance(alias, precision, defs),
        Ok(ImplInput::Embed { request, defs }) => embed::expand_embed(request, defs),
        Err(e) => e.to_compile_error(),
    }
}
