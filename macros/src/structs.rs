//! `#[model]` on a struct: the fields become layers generic over the backend `Be`; the
//! expansion adds the `Grads` struct, the `Module` impl (named visits, updates,
//! checkpoints, seeded init) and a hidden `macro_rules!` through which the
//! `#[model] impl` of the same struct receives the field list.

use crate::dsl::FieldKind;
use crate::model::{is_dynamic, parse_fields, Def};
use kiln_tensor::Precision;
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Fields, Ident, ItemImpl, ItemStruct};

/// The name of the hidden callback macro of a model.
pub fn callback_name(model: &Ident) -> Ident {
    format_ident!("__kiln_model_{}", model)
}

/// Expands `#[model] struct`; an instance under a loss-scaled `precision` also holds
/// its loss scale, one under int8 the int8 form of its layers.
pub fn expand_struct(item: ItemStruct, precision: Precision) -> syn::Result<TokenStream> {
    if !item.generics.params.is_empty() {
        return Ok(definition(&item));
    }
    // Two nested models of one name are refused, but the struct keeps its fields (their
    // types are fine), so code that reads them sees no second error.
    let (fields, refused) = match parse_fields(&item) {
        Ok(f) => (f, None),
        Err(e) => match crate::model::parse_field_types(&item) {
            Ok(f) => (f, Some(e.to_compile_error())),
            Err(_) => return Ok(placeholder(&item, e.to_compile_error())),
        },
    };
    let name = &item.ident;
    let vis = &item.vis;
    // The precision mark a definition carries for `embed!` is the macro's own.
    let attrs: Vec<&syn::Attribute> = item
        .attrs
        .iter()
        .filter(|a| !a.path().is_ident(crate::embed::PRECISION_MARK))
        .collect();
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
        let ty = mf.kind.real_type_in(precision);
        quote!(#(#fattrs)* #fvis #id: #ty)
    });
    let grad_defs = fields.iter().map(|mf| {
        let id = &mf.ident;
        let ty = mf.kind.real_type_in(precision);
        let doc = format!("Gradients of `{id}`.");
        match mf.kind {
            FieldKind::Dynamic(_) => quote!(#[doc = #doc] pub #id: ::kiln::dynamic::Gradients<Be>),
            _ => quote!(#[doc = #doc] pub #id: <#ty as ::kiln::tensor::nn::Module<Be>>::Grads),
        }
    });
    let ids: Vec<&Ident> = fields.iter().map(|f| &f.ident).collect();
    let types: Vec<TokenStream> = fields
        .iter()
        .map(|f| f.kind.real_type_in(precision))
        .collect();
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

    // Only a loss-scaled model holds a scale: the optimizer skips steps by it.
    let (scale_field, scale_init, scale_of, scale_method) = match precision.loss_scaled() {
        false => (quote!(), quote!(), quote!(), quote!()),
        true => (
            quote! {
                #[doc(hidden)]
                pub __kiln_loss_scale: ::kiln::tensor::nn::LossScale<Be>,
            },
            quote!(__kiln_loss_scale: ::kiln::tensor::nn::LossScale::new(),),
            quote! {
                fn loss_scale(&self) -> ::core::option::Option<&::kiln::tensor::nn::LossScale<Be>> {
                    ::core::option::Option::Some(&self.__kiln_loss_scale)
                }
            },
            quote! {
                /// The dynamic loss scale its training steps start the backward pass
                /// from (f16 gradients kept in range); the optimizer skips a step whose
                /// gradients overflowed and halves it.
                pub fn loss_scale(&self) -> &::kiln::tensor::nn::LossScale<Be> {
                    &self.__kiln_loss_scale
                }
            },
        ),
    };

    Ok(quote! {
        #refused
        #(#attrs)*
        #vis struct #name<Be: ::kiln::tensor::Backend> {
            #(#field_defs,)*
            #[doc(hidden)]
            pub __kiln_seeds: ::kiln::tensor::nn::StepSeeds<Be>,
            #[doc(hidden)]
            pub __kiln_plans: ::kiln::fusion::Programs<Be>,
            #scale_field
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
                    #scale_init
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

            #scale_of

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

            #scale_method
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
    let params = match crate::model::size_params(&item.generics) {
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
    let def = crate::structs::def_macro(
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

/// The macro through which other models reach this one's definition: re-exported
/// under the struct's own name (a `use` of the struct brings it along, a path to the
/// struct reaches it, from another crate too), it hands the struct, the impl and the
/// definitions of this model's own nested models to `model_impl!`, appended to what it
/// was given. `#[macro_export]` puts it at the crate root, so its own name carries a
/// hash of the definition (FNV-1a of its tokens, the same on every toolchain): two
/// models of one name in two modules do not collide.
pub(crate) fn def_macro(
    item: &ItemStruct,
    imp: &ItemImpl,
    defs: &[Def],
    broken: bool,
) -> TokenStream {
    let name = &item.ident;
    let kw = quote::format_ident!("{}", if broken { "broken_def" } else { "def" });
    let hash = quote!(#item #imp #(#defs)*)
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let exported = quote::format_ident!("__kiln_def_{}_{:016x}", name, hash);
    quote! {
        #[doc(hidden)]
        #[macro_export]
        macro_rules! #exported {
            ($($given:tt)*) => {
                ::kiln::__private::model_impl! { $($given)* #kw { #item ; #imp } #(#defs)* }
            };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        pub use #exported as #name;
    }
}
