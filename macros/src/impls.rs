//! `#[model]` on an impl: each method's body is lowered to a graph (every shape
//! checked) and planned; the method becomes a typed method of `Model<Be>` that is a
//! thin shim over a hidden raw method generic over the backend only, which runs the
//! plan with the sizes given at run time (fused, or op by op). Each method that returns
//! a scalar also gets `<name>_and_grad`.

use crate::dsl::{DimTok, FieldKind};
use crate::lower::{Lower, Val};
use crate::model::{parse_defs, parse_fields, parse_method, raw_name, size_args, Def, MethodSig};
use crate::structs::def_macro;
use crate::train::value_and_grad;
use kiln_tensor::ir::NodeId;
use kiln_tensor::nn::Mode;
use kiln_tensor::Precision;
use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::Ident;
use syn::{ImplItem, ItemImpl, ItemStruct};

/// The path of the first nested model, among the fields of `item` and of `defs`,
/// whose definition is not in `defs` yet (read from the field types as written, so a
/// definition with sizes is searched too).
fn missing_def(item: &ItemStruct, defs: &[Def]) -> Option<syn::Path> {
    let known = |name: &str| defs.iter().any(|d| d.item.ident == name);
    let mut missing = None;
    for s in std::iter::once(item).chain(defs.iter().map(|d| &d.item)) {
        // A dynamic part is a plain Rust type, with no definition to receive.
        for f in s
            .fields
            .iter()
            .filter(|f| !crate::model::is_dynamic_field(f))
        {
            let mut ty = f.ty.clone();
            crate::model::model_paths_mut(&mut ty, &mut |p| {
                if missing.is_none() && !known(&crate::dsl::model_name(&p.path)) {
                    missing = Some(crate::model::bare_path(&p.path));
                }
            });
        }
    }
    missing
}

/// Expands the impl of a model whose struct is `item`, given the definitions of its
/// nested models gathered so far: while one is missing, the expansion asks that
/// model's definition macro for it (which calls back with it appended).
pub fn expand_impl(item: ItemStruct, imp: ItemImpl, def_items: Vec<Def>) -> TokenStream {
    if let Some(path) = missing_def(&item, &def_items) {
        return quote!(#path! { #item ; #imp #(#def_items)* });
    }
    if !item.generics.params.is_empty() {
        return expand_definition(&item, &imp, &def_items);
    }
    expand_impl_in(item, imp, def_items, Mistakes::Reported(""), Precision::F32).0
}

/// The impl of a model with sizes: checked for what can be checked without sizes,
/// then handed to its instances through the definition macro.
fn expand_definition(item: &ItemStruct, imp: &ItemImpl, defs: &[Def]) -> TokenStream {
    let Ok(params) = crate::model::size_params(&item.generics) else {
        // The struct's own expansion reports it.
        return quote!();
    };
    let mut errors = Vec::new();
    if imp.trait_.is_some() {
        errors.push(syn::Error::new(
            imp.span(),
            "write `#[model] impl Model { .. }`: no trait",
        ));
    }
    let own: Vec<Ident> = imp
        .generics
        .params
        .iter()
        .filter_map(|p| match p {
            syn::GenericParam::Const(c) => Some(c.ident.clone()),
            _ => None,
        })
        .collect();
    if !imp.generics.params.is_empty() && (own != params || own.len() != imp.generics.params.len())
    {
        let names: Vec<String> = params.iter().map(|p| format!("const {p}: usize")).collect();
        errors.push(syn::Error::new(
            imp.generics.span(),
            format!(
                "the impl's parameters are the struct's sizes: `impl<{}>`, or none (`impl {}`)",
                names.join(", "),
                item.ident
            ),
        ));
    }
    errors.extend(crate::model::check_definition(&params, imp, &item.ident));
    let mut errors: Vec<TokenStream> = errors.iter().map(|e| e.to_compile_error()).collect();
    if errors.is_empty() {
        let this = Def {
            item: item.clone(),
            imp: imp.clone(),
            broken: false,
        };
        errors.extend(crate::instances::definition_mistakes(&this, defs).unwrap_or_default());
    }
    // A definition with mistakes of its own is handed on marked broken: its instances
    // repeat none of them.
    let def = def_macro(item, imp, defs, !errors.is_empty());
    quote!(#def #(#errors)*)
}

/// The shape mistakes of a model's methods, found by lowering each one (nothing
/// planned or generated): how an instance of a model with sizes is checked again with
/// its sizes varied. `None` when its fields or methods do not parse.
pub(crate) fn shape_mistakes(
    item: &ItemStruct,
    imp: &ItemImpl,
    def_items: &[Def],
    precision: Precision,
) -> Option<Vec<syn::Error>> {
    let fields = parse_fields(item).ok()?;
    let defs = parse_defs(def_items);
    let methods = imp
        .items
        .iter()
        .map(|it| match it {
            ImplItem::Fn(f) => parse_method(f).ok(),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let mut errors = Vec::new();
    for m in &methods {
        let mut lower = Lower::new(&fields, &methods, &defs, Mode::Eval, precision);
        let _ = lower.lower_method(m);
        errors.append(&mut lower.errors);
    }
    Some(errors)
}

/// What an expansion does with the mistakes it finds.
#[derive(Clone, Copy)]
pub(crate) enum Mistakes<'a> {
    /// Reports them, each message followed by this context (which instance this is, if
    /// one).
    Reported(&'a str),
    /// Leaves them out: the definition's own expansion reported them.
    Silent,
}

/// Expands the impl of a model with literal sizes, its mistakes reported or not; with
/// whether it found none.
pub(crate) fn expand_impl_in(
    item: ItemStruct,
    imp: ItemImpl,
    def_items: Vec<Def>,
    mistakes: Mistakes<'_>,
    precision: Precision,
) -> (TokenStream, bool) {
    let model = &item.ident;
    let fields = match parse_fields(&item) {
        Ok(f) => f,
        // The struct's own expansion already reports these; where its fields' types
        // were fine (two nested models of one name), the struct holds its fields and
        // the methods keep their signatures, so callers see no second error.
        Err(_) => return (stubs_only(&item, &imp, &def_items, precision), false),
    };
    let defs = parse_defs(&def_items);
    let mut errors: Vec<syn::Error> = Vec::new();
    // A nested model with sizes is a definition, not a type: only its instances hold.
    for f in &fields {
        let mut kind = &f.kind;
        while let FieldKind::Array(inner, _) = kind {
            kind = inner;
        }
        let FieldKind::Model(path) = kind else {
            continue;
        };
        let name = crate::dsl::model_name(path);
        let Some(def) = def_items.iter().find(|d| d.item.ident == name) else {
            continue;
        };
        if let Ok(params) = crate::model::size_params(&def.item.generics) {
            if !params.is_empty() {
                let names: Vec<String> = params.iter().map(|p| p.to_string()).collect();
                errors.push(syn::Error::new(
                    f.ident.span(),
                    format!(
                        "`{}` holds `{name}`, a model with sizes ({}): declare an instance, `#[model] type {name}Part = {name}<..>;`, and hold that",
                        f.ident,
                        names.join(", ")
                    ),
                ));
            }
        }
    }
    if !imp.generics.params.is_empty() || imp.trait_.is_some() {
        errors.push(syn::Error::new(imp.span(), "write `#[model] impl Model { .. }`: no generics, no trait (the backend `Be` is added for you)"));
    }
    let mut methods = Vec::new();
    for it in &imp.items {
        match it {
            ImplItem::Fn(f) => match parse_method(f) {
                Ok(m) => methods.push(m),
                Err(e) => errors.push(e),
            },
            other => errors.push(syn::Error::new(
                other.span(),
                "a #[model] impl holds methods only",
            )),
        }
    }
    let mut out = Vec::new();
    let mut natives = crate::fuse::Natives::new(model);
    // (title, plan const) of every planned method, for the printouts.
    let mut plans: Vec<(String, syn::Ident)> = Vec::new();
    // The calls of `forward` (else of the first method), for `summary()`.
    let mut summary_calls: Option<(String, Vec<crate::lower::Call>)> = None;
    for (mi, m) in methods.iter().enumerate() {
        let mut lower = Lower::new(&fields, &methods, &defs, Mode::Eval, precision);
        let result = lower.lower_method(m);
        if *m.name() == "forward" || (mi == 0 && summary_calls.is_none()) {
            summary_calls = Some((m.name().to_string(), std::mem::take(&mut lower.calls)));
        }
        let method_errors = std::mem::take(&mut lower.errors);
        if method_errors.is_empty() {
            if let Ok(v) = result {
                let name =
                    quote::format_ident!("__KILN_PLAN_{}", m.name().to_string().to_uppercase());
                plans.push((m.name().to_string(), name.clone()));
                let results = result_nodes(&v);
                // A value returned twice is one output of the plan.
                let mut outputs: Vec<NodeId> = Vec::new();
                for &n in &results {
                    if !outputs.contains(&n) {
                        outputs.push(n);
                    }
                }
                let fused =
                    crate::fuse::fuse(&lower.mg, &outputs, 2 * mi, &name, &mut natives, false);
                let picks: Vec<usize> = results
                    .iter()
                    .map(|n| {
                        outputs
                            .iter()
                            .position(|o| o == n)
                            .expect("deduplicated from these")
                    })
                    .collect();
                out.push(planned_method(m, &fused, outputs.len(), &picks, &fields));
                if m.is_scalar_loss() && !precision.trains() {
                    out.push(untrained_and_grad(model, m, precision));
                }
                // An int8 instance is for inference: its losses evaluate, nothing trains.
                if m.is_scalar_loss() && precision.trains() {
                    match value_and_grad(
                        model,
                        &fields,
                        &methods,
                        &defs,
                        precision,
                        m,
                        2 * mi + 1,
                        &mut natives,
                    ) {
                        Ok(t) => {
                            plans.push((
                                format!("{}_and_grad", m.name()),
                                quote::format_ident!(
                                    "__KILN_PLAN_{}_AND_GRAD",
                                    m.name().to_string().to_uppercase()
                                ),
                            ));
                            out.push(t)
                        }
                        Err(es) => {
                            errors.extend(es);
                            out.push(stub_and_grad(model, m));
                        }
                    }
                }
                continue;
            }
        }
        errors.extend(method_errors);
        out.push(stub_method(m));
        if m.is_scalar_loss() {
            out.push(match precision.trains() {
                true => stub_and_grad(model, m),
                false => untrained_and_grad(model, m, precision),
            });
        }
    }
    let compile_errors: Vec<TokenStream> = match mistakes {
        Mistakes::Reported(context) => errors
            .iter()
            .map(|e| crate::lower::messages::errors_in(e, context))
            .collect(),
        Mistakes::Silent => Vec::new(),
    };
    let natives = natives.module();
    // What `embed!` into this model needs to know of its precision (the tensors an
    // int8 instance holds) travels with its definition, as an attribute only the
    // macro reads.
    let mut marked = item.clone();
    if precision != Precision::F32 {
        let name = precision.name();
        marked
            .attrs
            .push(syn::parse_quote!(#[kiln_precision = #name]));
        debug_assert!(marked
            .attrs
            .last()
            .is_some_and(|a| a.path().is_ident(crate::embed::PRECISION_MARK)));
    }
    let def = def_macro(&marked, &imp, &def_items, !errors.is_empty());
    let summary = summary_text(
        model,
        crate::lower::model_params(&fields, &defs),
        summary_calls,
    );
    let summary_doc = format!(
        "What [`{model}`] holds, written at build time: each layer and nested model its first method (`forward` if it has one) calls, in call order, with the shape it returns and its parameter count, and the model's total."
    );
    let titles: Vec<String> = plans.iter().map(|(t, _)| format!("{model}::{t}")).collect();
    let consts: Vec<&syn::Ident> = plans.iter().map(|(_, c)| c).collect();
    let clean = errors.is_empty();
    // Emitted whatever the mistakes: a stubbed `loss` keeps its raw method, so a model
    // with a shape error is still one the Learner takes, and its uses add no error.
    let supervised = supervised_impl(model, &methods, precision);
    let expanded = quote! {
        impl<Be: ::kiln::tensor::Backend> #model<Be> {
            #(#out)*

            /// The build-time fusion plans of this model's methods, as `(method, plan
            /// text)`: the forward methods and the value-and-gradient entries.
            pub fn fusion_plans() -> &'static [(&'static str, &'static str)] {
                &[#((#titles, Self::#consts)),*]
            }

            /// A printout of every fusion plan: kernels, what each fuses, and the bytes
            /// each reads and writes per call (in terms of the size parameters).
            pub fn fusion_report() -> ::kiln::tensor::Result<::std::string::String> {
                ::kiln::fusion::report::report_all(Self::fusion_plans())
            }

            /// Every fusion plan as one Graphviz DOT graph, a cluster per kernel.
            pub fn fusion_dot() -> ::kiln::tensor::Result<::std::string::String> {
                ::kiln::fusion::report::dot_all(Self::fusion_plans())
            }

            #[doc = #summary_doc]
            pub fn summary() -> &'static str {
                #summary
            }
        }
        #supervised
        #natives
        #def
        #(#compile_errors)*
    };
    (expanded, clean)
}

/// A call of `bind_sizes` reading `m`'s size parameters from the raw tensors
/// `values`: `None` when a size parameter of `m` appears in none of its arguments'
/// dims (it cannot be read from them).
fn size_binding(model: &Ident, m: &MethodSig, values: &[TokenStream]) -> Option<TokenStream> {
    let bound: Vec<String> = m
        .args
        .iter()
        .flat_map(|(_, t)| &t.dims)
        .filter_map(|d| match d {
            DimTok::Param(p) => Some(p.to_string()),
            _ => None,
        })
        .collect();
    if m.consts.iter().any(|c| !bound.contains(&c.to_string())) {
        return None;
    }
    let title = format!("{model}::{}", m.name());
    let declared = m.args.iter().map(|(name, ty)| {
        let name = name.to_string();
        let e = crate::dsl::dtype_type(ty.dtype);
        let dims = ty.dims.iter().map(|d| match d {
            DimTok::Lit(n) => quote!(Lit(#n)),
            DimTok::Param(p) => {
                let p = p.to_string();
                quote!(Param(#p))
            }
            DimTok::Dyn => quote!(Dyn),
        });
        quote!((#name, <#e as ::kiln::tensor::Element>::DTYPE, &[#(#dims),*]))
    });
    Some(quote! {{
        use ::kiln::train::learner::DimSpec::*;
        ::kiln::train::learner::bind_sizes(#title, &[#(#declared),*], &[#(#values),*])?
    }})
}

/// `Supervised` for a model whose impl has `loss(input, target)` returning a scalar
/// (and, for metrics, `forward(input)`), calling their planned raw methods with the
/// sizes read from the batch; `None` for a model without such a `loss`.
fn supervised_impl(
    model: &Ident,
    methods: &[MethodSig],
    precision: Precision,
) -> Option<TokenStream> {
    let loss = methods
        .iter()
        .find(|m| *m.name() == "loss" && m.is_scalar_loss() && m.args.len() == 2)?;
    let pair = [quote!(input), quote!(target)];
    let sizes = size_binding(model, loss, &pair)?;
    let raw_loss = raw_name(loss.name());
    let raw_and_grad = quote::format_ident!("__kiln_{}_and_grad", loss.name());
    let scores = methods
        .iter()
        .find(|m| *m.name() == "forward" && m.args.len() == 1 && !m.ret_tuple && m.ret.len() == 1)
        .and_then(|f| Some((raw_name(f.name()), size_binding(model, f, &pair[..1])?)));
    let scores = match scores {
        Some((raw, sizes)) => quote!(Ok(Some(self.#raw(&#sizes, input)?))),
        None => quote!(Ok(None)),
    };
    let raw = quote!(::kiln::tensor::RawTensor<Be>);
    // An instance that does not train evaluates its loss and scores, and refuses steps.
    let loss_and_grads = match precision.trains() {
        true => quote!(self.#raw_and_grad(&Self::__kiln_loss_sizes(input, target)?, input, target)),
        false => {
            let why = format!(
                "`{model}` is an {precision} instance, for inference: train the f32 model and quantise its checkpoint (kiln-quantize)"
            );
            quote! {
                let _ = (input, target);
                Err(::kiln::tensor::Error::invalid("loss_and_grads", #why))
            }
        }
    };
    Some(quote! {
        impl<Be: ::kiln::tensor::Backend> #model<Be> {
            #[doc(hidden)]
            fn __kiln_loss_sizes(input: &#raw, target: &#raw) -> ::kiln::tensor::Result<::std::vec::Vec<(&'static str, usize)>> {
                Ok(#sizes)
            }
        }

        impl<Be: ::kiln::tensor::Backend> ::kiln::train::learner::Supervised<Be> for #model<Be> {
            fn loss_and_grads(
                &self,
                input: &#raw,
                target: &#raw,
            ) -> ::kiln::tensor::Result<(#raw, <Self as ::kiln::tensor::nn::Module<Be>>::Grads)> {
                #loss_and_grads
            }

            fn eval_loss(&self, input: &#raw, target: &#raw) -> ::kiln::tensor::Result<#raw> {
                self.#raw_loss(&Self::__kiln_loss_sizes(input, target)?, input, target)
            }

            fn scores(&self, input: &#raw) -> ::kiln::tensor::Result<::core::option::Option<#raw>> {
                #scores
            }

            fn draws_at_random() -> bool {
                ::kiln::fusion::plan::training_draws(Self::fusion_plans())
            }
        }
    })
}

fn signature(m: &MethodSig) -> TokenStream {
    let item = &m.item;
    let (attrs, vis, name) = (&item.attrs, &item.vis, &item.sig.ident);
    let consts = &m.consts;
    let names = m.args.iter().map(|(n, _)| n);
    let tys = m.args.iter().map(|(_, t)| t.real_type());
    let rets: Vec<TokenStream> = m.ret.iter().map(|t| t.real_type()).collect();
    let ret = if m.ret_tuple {
        quote!((#(#rets,)*))
    } else {
        rets[0].clone()
    };
    quote! {
        #(#attrs)*
        #vis fn #name<#(const #consts: usize),*>(&self, #(#names: &#tys),*) -> ::kiln::tensor::Result<#ret>
    }
}

/// The nodes a method returns, in order (one, or the parts of its tuple).
fn result_nodes(v: &Val) -> Vec<NodeId> {
    match v {
        Val::T(n) => vec![*n],
        Val::Tuple(parts) => parts.iter().flat_map(result_nodes).collect(),
        _ => Vec::new(),
    }
}

/// A planned method: the typed method the user declared, a thin shim over the hidden
/// raw method that runs the plan (`plan_outputs` values, returned as `picks`).
fn planned_method(
    m: &MethodSig,
    fused: &crate::fuse::Fused,
    plan_outputs: usize,
    picks: &[usize],
    fields: &[crate::model::ModelField],
) -> TokenStream {
    let sig = signature(m);
    let raw = raw_name(m.name());
    let sizes = size_args(m);
    let args: Vec<&Ident> = m.args.iter().map(|(n, _)| n).collect();
    let device = match args.first() {
        Some(a) => quote!(#a.device().clone()),
        None => crate::train::first_param_device(fields)
            .unwrap_or_else(|| quote!(::core::default::Default::default())),
    };
    let raw_ty = quote!(::kiln::tensor::RawTensor<Be>);
    let next = quote!(__outs.next().expect("a plan returns each of its outputs"));
    let (raw_ret, take, value) = if m.ret_tuple {
        let outs: Vec<Ident> = (0..plan_outputs)
            .map(|i| quote::format_ident!("__out{}", i))
            .collect();
        let tys = outs.iter().map(|_| &raw_ty);
        let nexts = outs.iter().map(|_| &next);
        // A value returned twice is one output of the plan, so each part is a clone.
        let parts = picks.iter().map(|&i| {
            let o = &outs[i];
            quote!(::kiln::tensor::Tensor::from_raw(#o.clone())?)
        });
        (
            quote!((#(#tys,)*)),
            quote!(|__outs| (#(#nexts,)*)),
            quote! {
                let (#(#outs,)*) = self.#raw(#sizes, #(#args.raw()),*)?;
                Ok((#(#parts,)*))
            },
        )
    } else {
        (
            raw_ty.clone(),
            quote!(|__outs| #next),
            quote!(::kiln::tensor::Tensor::from_raw(self.#raw(#sizes, #(#args.raw()),*)?)),
        )
    };
    let run = fused.run(take);
    let (plan_const, parts) = (&fused.plan_const, &fused.parts);
    quote! {
        #plan_const

        #sig {
            #value
        }

        #[doc(hidden)]
        #[allow(clippy::too_many_arguments)]
        fn #raw(&self, __sizes: &[(&str, usize)], #(#args: &#raw_ty),*) -> ::kiln::tensor::Result<#raw_ret> {
            let __dev = #device;
            // Evaluation mode draws nothing at random.
            let __seed = ::kiln::tensor::nn::StepSeed::Host(0);
            #parts
            Ok(#run)
        }
    }
}

/// The error a stub returns. It never runs: the build has already failed with the
/// macro's message, and the stub only keeps callers free of a second error.
fn not_compiled(m: &MethodSig) -> TokenStream {
    let name = m.name().to_string();
    quote!(Err(::kiln::tensor::Error::invalid(#name, "this model method did not compile")))
}

/// A method whose body did not lower keeps its signature and its hidden raw method
/// (which `Supervised` calls), so callers do not see a second error; both bodies
/// return an error and never run: the build has already failed.
fn stub_method(m: &MethodSig) -> TokenStream {
    let sig = signature(m);
    let raw = raw_name(m.name());
    let args: Vec<&Ident> = m.args.iter().map(|(n, _)| n).collect();
    let raw_ty = quote!(::kiln::tensor::RawTensor<Be>);
    let raw_ret = match m.ret_tuple {
        true => {
            let tys = m.ret.iter().map(|_| &raw_ty);
            quote!((#(#tys,)*))
        }
        false => raw_ty.clone(),
    };
    let fail = not_compiled(m);
    quote! {
        #[allow(unused_variables)]
        #sig {
            #fail
        }

        #[doc(hidden)]
        #[allow(unused_variables, dead_code, clippy::too_many_arguments)]
        fn #raw(&self, __sizes: &[(&str, usize)], #(#args: &#raw_ty),*) -> ::kiln::tensor::Result<#raw_ret> {
            #fail
        }
    }
}

/// `<name>_and_grad` of a scalar method that did not lower, with its signature and its
/// hidden raw method, so that a caller of the training entry (or the Learner) sees no
/// second error.
fn stub_and_grad(model: &Ident, m: &MethodSig) -> TokenStream {
    let fname = quote::format_ident!("{}_and_grad", m.name());
    let raw = quote::format_ident!("__kiln_{}_and_grad", m.name());
    let consts = &m.consts;
    let arg_names: Vec<&Ident> = m.args.iter().map(|(n, _)| n).collect();
    let arg_tys: Vec<TokenStream> = m.args.iter().map(|(_, t)| t.real_type()).collect();
    let grads_ty = quote::format_ident!("{}Grads", model);
    let ret = m.ret[0].real_type();
    let fail = not_compiled(m);
    quote! {
        #[allow(unused_variables)]
        pub fn #fname<#(const #consts: usize),*>(&self, #(#arg_names: &#arg_tys),*) -> ::kiln::tensor::Result<(#ret, #grads_ty<Be>)> {
            #fail
        }

        #[doc(hidden)]
        #[allow(unused_variables, dead_code, clippy::too_many_arguments)]
        fn #raw(&self, __sizes: &[(&str, usize)], #(#arg_names: &::kiln::tensor::RawTensor<Be>),*) -> ::kiln::tensor::Result<(::kiln::tensor::RawTensor<Be>, #grads_ty<Be>)> {
            #fail
        }
    }
}

/// `<name>_and_grad` of an instance that does not train (int8): there, so a call is not
/// read as a misspelling of `Supervised::loss_and_grads`, and refused when the program
/// compiles by a bound only training models meet (`kiln::__private::Trains`), whose
/// message says what the instance is for.
fn untrained_and_grad(model: &Ident, m: &MethodSig, precision: Precision) -> TokenStream {
    let fname = quote::format_ident!("{}_and_grad", m.name());
    let consts = &m.consts;
    let arg_names: Vec<&Ident> = m.args.iter().map(|(n, _)| n).collect();
    let arg_tys: Vec<TokenStream> = m.args.iter().map(|(_, t)| t.real_type()).collect();
    let grads_ty = quote::format_ident!("{}Grads", model);
    let ret = m.ret[0].real_type();
    let doc = format!(
        "Not available: `{model}` is an {precision} instance, for inference (calling this is a compile error). Train the f32 model and quantise its checkpoint (kiln-quantize)."
    );
    let why = format!(
        "`{model}` is an {precision} instance, for inference: train the f32 model and quantise its checkpoint (kiln-quantize)"
    );
    let name = fname.to_string();
    quote! {
        #[doc = #doc]
        #[allow(unused_variables)]
        pub fn #fname<#(const #consts: usize),*>(&self, #(#arg_names: &#arg_tys),*) -> ::kiln::tensor::Result<(#ret, #grads_ty<Be>)>
        where
            Self: ::kiln::__private::Trains,
        {
            Err(::kiln::tensor::Error::invalid(#name, #why))
        }
    }
}

/// The impl of a model whose struct reported a mistake of its own while keeping its
/// fields (two nested models of one name): every method with its signature, its
/// training entry and `Supervised`, bodies stubbed and no error repeated.
fn stubs_only(
    item: &ItemStruct,
    imp: &ItemImpl,
    defs: &[Def],
    precision: Precision,
) -> TokenStream {
    if crate::model::parse_field_types(item).is_err() {
        // The struct is a placeholder without fields: its callback drops this impl.
        return quote!();
    }
    let model = &item.ident;
    let methods: Vec<MethodSig> = imp
        .items
        .iter()
        .filter_map(|it| match it {
            ImplItem::Fn(f) => parse_method(f).ok(),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for m in &methods {
        out.push(stub_method(m));
        if m.is_scalar_loss() {
            out.push(match precision.trains() {
                true => stub_and_grad(model, m),
                false => untrained_and_grad(model, m, precision),
            });
        }
    }
    let supervised = supervised_impl(model, &methods, precision);
    // Models holding this one find its definition, marked broken: they report nothing
    // more about it.
    let def = def_macro(item, imp, defs, true);
    quote! {
        #def
        impl<Be: ::kiln::tensor::Backend> #model<Be> {
            #(#out)*

            /// No plans: this model did not compile.
            pub fn fusion_plans() -> &'static [(&'static str, &'static str)] {
                &[]
            }

            /// No plans to print: this model did not compile.
            pub fn fusion_report() -> ::kiln::tensor::Result<::std::string::String> {
                ::kiln::fusion::report::report_all(Self::fusion_plans())
            }

            /// No plans to draw: this model did not compile.
            pub fn fusion_dot() -> ::kiln::tensor::Result<::std::string::String> {
                ::kiln::fusion::report::dot_all(Self::fusion_plans())
            }

            /// Nothing to summarise: this model did not compile.
            pub fn summary() -> &'static str {
                ""
            }
        }
        #supervised
    }
}

/// The text of `summary()`: a line per call (nested calls indented), then the total.
fn summary_text(
    model: &Ident,
    total: usize,
    calls: Option<(String, Vec<crate::lower::Call>)>,
) -> String {
    let (method, calls) = calls.unwrap_or_default();
    let rows: Vec<[String; 4]> = calls
        .iter()
        .map(|c| {
            [
                format!("{}{}", "  ".repeat(c.depth), c.key),
                c.what.clone(),
                c.output.clone(),
                c.params.map_or("run time".into(), thousands),
            ]
        })
        .collect();
    let heads = [
        "layer".to_string(),
        "type".into(),
        "output".into(),
        "params".into(),
    ];
    let width = |i: usize| {
        rows.iter()
            .chain([&heads])
            .map(|r| r[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let w = [width(0), width(1), width(2), width(3)];
    let line = |r: &[String; 4]| {
        format!(
            "  {:<a$}  {:<b$}  {:<c$}  {:>d$}",
            r[0],
            r[1],
            r[2],
            r[3],
            a = w[0],
            b = w[1],
            c = w[2],
            d = w[3]
        )
        .trim_end()
        .to_string()
    };
    let mut out = format!("{model}: {} parameters", thousands(total));
    if calls.iter().any(|c| c.params.is_none()) {
        out.push_str(" outside its dynamic parts");
    }
    if !rows.is_empty() {
        out.push_str(&format!("; what `{method}` calls:\n"));
        out.push_str(&line(&heads));
        for r in &rows {
            out.push('\n');
            out.push_str(&line(r));
        }
    }
    out.push('\n');
    out
}

/// `1234567` as `1,234,567`.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
