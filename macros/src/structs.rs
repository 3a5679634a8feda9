//! `#[model]` on a struct: the fields become layers generic over the backend `Be`; the
//! expansion adds the `Grads` struct, the `Module` impl (named visits, updates,
//! checkpoints, seeded init) and a hidden `macro_rules!` through which the
//! `#[model] impl` of the same struct receives the field list.

use crate::dsl::{parse_field_type, FieldKind};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{Fields, Ident, ItemStruct};

/// A parsed field.
pub struct ModelField {
    /// Its name.
    pub ident: Ident,
    /// What it holds.
    pub kind: FieldKind,
}

/// Parses the fields of a model struct.
pub fn parse_fields(item: &ItemStruct) -> syn::Result<Vec<ModelField>> {
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
    if let Err(e) = one_model_per_name(&out) {
        match &mut errors {
            Some(all) => all.combine(e),
            None => errors = Some(e),
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
fn one_model_per_name(fields: &[ModelField]) -> syn::Result<()> {
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
fn is_dynamic(a: &syn::Attribute) -> bool {
    a.path().is_ident("dynamic")
}

/// Whether a field is marked `#[dynamic]` (holds a module on the dynamic path).
pub(crate) fn is_dynamic_field(f: &syn::Field) -> bool {
    f.attrs.iter().any(is_dynamic)
}

/// A `#[dynamic]` field: a module on the dynamic path, named by a plain path (the
/// backend parameter is added, as for nested models).
fn dynamic_field(f: &syn::Field) -> syn::Result<FieldKind> {
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

/// The name of the hidden callback macro of a model.
pub fn callback_name(model: &Ident) -> Ident {
    format_ident!("__kiln_model_{}", model)
}

/// Expands `#[model] struct`.
pub fn expand_struct(item: ItemStruct) -> syn::Result<TokenStream> {
    if !item.generics.params.is_empty() {
        return Ok(definition(&item));
    }
    let fields = match parse_fields(&item) {
        Ok(f) => f,
        Err(e) => return Ok(placeholder(&item, e.to_compile_error())),
    };
    let name = &item.ident;
    let vis = &item.vis;
    let attrs = &item.attrs;
    let grads = format_ident!("{}Grads", name);
    let callback_macro = callback_macro(
        name,
        quote!(::kiln::__private::model_impl! { #item ; $($body)* }),
    );
    let Fields::Named(named) = &item.fields else {
        unreachable!("checked by parse_fields")
    };

    let field_defs = named.named.iter().zip(&fields).map(|(f, mf)| {
        let (fvis, id) = (&f.vis, &mf.ident);
        let fattrs = f.attrs.iter().filter(|a| !is_dynamic(a));
        let ty = mf.kind.real_type();
        quote!(#(#fattrs)* #fvis #id: #ty)
    });
    let grad_defs = fields.iter().map(|mf| {
        let id = &mf.ident;
        let ty = mf.kind.real_type();
        let doc = format!("Gradients of `{id}`.");
        match mf.kind {
            FieldKind::Dynamic(_) => quote!(#[doc = #doc] pub #id: ::kiln::dynamic::Gradients<Be>),
            _ => quote!(#[doc = #doc] pub #id: <#ty as ::kiln::tensor::nn::Module<Be>>::Grads),
        }
    });
    let ids: Vec<&Ident> = fields.iter().map(|f| &f.ident).collect();
    let types: Vec<TokenStream> = fields.iter().map(|f| f.kind.real_type()).collect();
    // How a model that holds this one reaches its fields, which may be private here.
    let accessors: Vec<Ident> = ids
        .iter()
        .map(|i| format_ident!("__kiln_field_{}", i))
        .collect();
    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let struct_doc = format!("Gradients of every parameter of [`{name}`], field for field.");
    // A dynamic part's gradients are not in the backward pass's list: its own backward
    // pass gives them, and the training entry puts them in place.
    let grads_of_fields = fields.iter().zip(&types).map(|(f, ty)| {
        let id = &f.ident;
        match f.kind {
            FieldKind::Dynamic(_) => quote!(#id: ::core::default::Default::default()),
            _ => quote!(#id: <#ty as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?),
        }
    });

    Ok(quote! {
        #(#attrs)*
        #vis struct #name<Be: ::kiln::tensor::Backend> {
            #(#field_defs,)*
            #[doc(hidden)]
            pub __kiln_seeds: ::kiln::tensor::nn::StepSeeds<Be>,
            #[doc(hidden)]
            pub __kiln_plans: ::kiln::fusion::Programs<Be>,
        }

        #[doc = #struct_doc]
        #vis struct #grads<Be: ::kiln::tensor::Backend> {
            #(#grad_defs,)*
            #[doc(hidden)]
            pub __kiln_backend: ::core::marker::PhantomData<Be>,
        }

        impl<Be: ::kiln::tensor::Backend> ::kiln::tensor::nn::Module<Be> for #name<Be> {
            type Grads = #grads<Be>;

            fn init_named(device: &Be::Device, seed: u64, prefix: &str) -> ::kiln::tensor::Result<Self> {
                Ok(#name {
                    #(#ids: ::kiln::tensor::nn::Module::init_named(device, seed, &::kiln::tensor::nn::join(prefix, #names))?,)*
                    __kiln_seeds: ::kiln::tensor::nn::StepSeeds::new(seed),
                    __kiln_plans: ::core::default::Default::default(),
                })
            }

            fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>)) {
                #(self.#ids.visit_params(&::kiln::tensor::nn::join(prefix, #names), f);)*
            }

            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>)) {
                #(self.#ids.visit_buffers(&::kiln::tensor::nn::join(prefix, #names), f);)*
            }

            fn update_params(
                &mut self,
                grads: &Self::Grads,
                prefix: &str,
                f: &mut ::kiln::tensor::nn::UpdateFn<'_, Be>,
            ) -> ::kiln::tensor::Result<()> {
                #(::kiln::tensor::nn::with_name(prefix, #names, |name| self.#ids.update_params(&grads.#ids, name, f))?;)*
                Ok(())
            }

            fn load_named(
                &mut self,
                prefix: &str,
                get: &mut ::kiln::tensor::nn::LoadFn<'_, Be>,
            ) -> ::kiln::tensor::Result<()> {
                #(self.#ids.load_named(&::kiln::tensor::nn::join(prefix, #names), get)?;)*
                Ok(())
            }

            fn step_seeds(&self) -> ::core::option::Option<&::kiln::tensor::nn::StepSeeds<Be>> {
                ::core::option::Option::Some(&self.__kiln_seeds)
            }

            fn grads_from_raw(
                grads: &mut dyn ::core::iter::Iterator<Item = ::kiln::tensor::RawTensor<Be>>,
            ) -> ::kiln::tensor::Result<Self::Grads> {
                Ok(#grads {
                    #(#grads_of_fields,)*
                    __kiln_backend: ::core::marker::PhantomData,
                })
            }
        }

        impl<Be: ::kiln::tensor::Backend> #name<Be> {
            /// Builds the model on `device`, every parameter initialised from `seed`.
            pub fn init(device: &Be::Device, seed: u64) -> ::kiln::tensor::Result<Self> {
                <Self as ::kiln::tensor::nn::Module<Be>>::init_named(device, seed, "")
            }

            /// Whether methods run through their build-time fused plans (the default).
            pub fn fused(&self) -> bool {
                self.__kiln_plans.fused()
            }

            /// Runs methods through their fused plans (`true`) or op by op (`false`,
            /// the unfused reference path).
            pub fn set_fused(&self, on: bool) {
                self.__kiln_plans.set_fused(on)
            }

            #(
                #[doc(hidden)]
                #[inline]
                pub fn #accessors(&self) -> &#types {
                    &self.#ids
                }
            )*

            /// The seeds the training steps draw random values (dropout masks) with: a
            /// step counter, moved into device memory for a step captured as a graph.
            pub fn step_seeds(&self) -> &::kiln::tensor::nn::StepSeeds<Be> {
                &self.__kiln_seeds
            }
        }

        #callback_macro
    })
}

/// What `#[model] struct Gpt<const D: usize, ..>` expands to: a model with sizes is a
/// definition, not a type (stable Rust cannot write `Linear<D, {4 * D}>`), so the
/// struct becomes a stand-in type carrying its docs (holding nothing; `Module::init`
/// refuses), and the callback through which its impl receives it. Each
/// `#[model] type Name = Gpt<..>;` is a model.
fn definition(item: &ItemStruct) -> TokenStream {
    let (attrs, vis, name) = (&item.attrs, &item.vis, &item.ident);
    let callback_macro = callback_macro(
        name,
        quote!(::kiln::__private::model_impl! { #item ; $($body)* }),
    );
    let params = match crate::sizes::size_params(&item.generics) {
        Ok(p) => p,
        Err(e) => {
            let stripped = ItemStruct {
                generics: syn::Generics::default(),
                ..item.clone()
            };
            return placeholder(&stripped, e.to_compile_error());
        }
    };
    let sizes = params
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let doc = format!(
        "A model definition with the sizes {sizes}: each instance, `#[model] type Name = {name}<..>;`, is a model."
    );
    let refusal = format!(
        "`{name}` is a model definition with the sizes {sizes}; build an instance (`#[model] type Name = {name}<..>;`)"
    );
    // A stand-in type with the backend parameter, so a model that holds the
    // definition by mistake gets the macro's one error, not rustc's on the type too.
    let stand_in = stand_in(vis, name, &refusal);
    quote! {
        #(#attrs)*
        #[doc = ""]
        #[doc = #doc]
        #stand_in
        #callback_macro
    }
}

/// What a struct whose fields have errors expands to: the errors, the struct without
/// its fields, and a callback that drops the impl (whose errors would only repeat
/// these), so the build reports the fields' mistakes and nothing after them.
pub(crate) fn placeholder(item: &ItemStruct, errors: TokenStream) -> TokenStream {
    let (attrs, vis, name) = (&item.attrs, &item.vis, &item.ident);
    // The impl's errors would only repeat these: the callback drops it.
    let callback_macro = callback_macro(name, quote!());
    let stand_in = stand_in(vis, name, "this model did not compile");
    // Models that hold this one still find its definition, marked broken.
    let def = crate::impls::def_macro(
        &syn::parse_quote!(struct #name {}),
        &syn::parse_quote!(impl #name {}),
        &[],
        true,
    );
    quote! {
        #errors
        #(#attrs)*
        // A stand-in, so that models holding this one report nothing more; the build
        // has already failed.
        #stand_in
        #callback_macro
        #def
    }
}

/// The hidden `macro_rules!` through which `#[model] impl Name` reaches its struct:
/// it expands to `body` (with `$($body)*` the impl), and a path to it so the impl may
/// come before the struct.
fn callback_macro(name: &Ident, body: TokenStream) -> TokenStream {
    let callback = callback_name(name);
    quote! {
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #callback {
            ($($body:tt)*) => { #body };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        pub(crate) use #callback;
    }
}

/// A stand-in type that holds nothing (the caller writes its attributes first) and its
/// `Module` impl: visits see nothing, and `init` refuses with `message`.
fn stand_in(vis: &syn::Visibility, name: &syn::Ident, message: &str) -> TokenStream {
    quote! {
        #vis struct #name<Be: ::kiln::tensor::Backend> {
            #[doc(hidden)]
            pub __kiln_backend: ::core::marker::PhantomData<Be>,
        }

        impl<Be: ::kiln::tensor::Backend> ::kiln::tensor::nn::Module<Be> for #name<Be> {
            type Grads = ();
            fn init_named(_: &Be::Device, _: u64, _: &str) -> ::kiln::tensor::Result<Self> {
                Err(::kiln::tensor::Error::invalid("init", #message))
            }
            fn visit_params(&self, _: &str, _: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>)) {}
            fn visit_buffers(&self, _: &str, _: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>)) {}
            fn update_params(
                &mut self,
                _: &(),
                _: &str,
                _: &mut ::kiln::tensor::nn::UpdateFn<'_, Be>,
            ) -> ::kiln::tensor::Result<()> {
                Ok(())
            }
            fn load_named(
                &mut self,
                _: &str,
                _: &mut ::kiln::tensor::nn::LoadFn<'_, Be>,
            ) -> ::kiln::tensor::Result<()> {
                Ok(())
            }
        }
    }
}
