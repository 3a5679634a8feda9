//! `#[derive(Module)]`: the `Module` impl of a hand-written dynamic module, a struct
//! whose fields are parameters, layers, module lists or other derived modules (named
//! as PyTorch names them: `blocks.0.attn.q.weight`), with `#[module(skip)]` on fields
//! that hold no tensors (sizes, settings), and `#[module(init = path)]` on the struct
//! naming a function `fn(&Device, seed, prefix) -> Result<Self>` that builds it by name
//! (what a `#[model]` holding it in a `#[dynamic]` field calls; without it, such a
//! module is built by its constructor only).

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields};

/// Writes the impl, or the errors of a struct it cannot be written for.
pub fn expand(input: DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            name,
            "#[derive(Module)] needs a struct of parameters and modules",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            name,
            "#[derive(Module)] needs named fields (their names are the checkpoint names)",
        ));
    };
    let backend = input
        .generics
        .type_params()
        .next()
        .map(|p| p.ident.clone())
        .ok_or_else(|| {
            syn::Error::new_spanned(
                &input.generics,
                "#[derive(Module)] needs the backend as the struct's first type parameter: `struct Net<B: Backend>`",
            )
        })?;
    let mut errors: Option<syn::Error> = None;
    let mut init: Option<syn::Path> = None;
    for a in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        let r = a.parse_nested_meta(|m| {
            if m.path.is_ident("init") {
                init = Some(m.value()?.parse()?);
                Ok(())
            } else {
                Err(m
                    .error("unknown #[module] option on a struct: the one option is `init = path`"))
            }
        });
        if let Err(e) = r {
            match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            }
        }
    }
    let mut kept = Vec::new();
    for f in &fields.named {
        let mut skip = false;
        for a in f.attrs.iter().filter(|a| a.path().is_ident("module")) {
            let r = a.parse_nested_meta(|m| {
                if m.path.is_ident("skip") {
                    skip = true;
                    Ok(())
                } else {
                    Err(m.error("unknown #[module] option on a field: the one option is `skip`"))
                }
            });
            if let Err(e) = r {
                match &mut errors {
                    Some(all) => all.combine(e),
                    None => errors = Some(e),
                }
            }
        }
        if !skip {
            kept.push((f.ident.clone().expect("named field"), &f.ty));
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let m = quote!(::kiln::tensor::nn);
    let names: Vec<String> = kept.iter().map(|(i, _)| i.to_string()).collect();
    let idents: Vec<&syn::Ident> = kept.iter().map(|(i, _)| i).collect();
    let bounds = kept.iter().map(
        |(_, ty)| quote!(#ty: #m::Module<#backend, Grads = ::kiln::dynamic::Gradients<#backend>>),
    );
    let where_all = match where_clause {
        Some(w) => quote!(#w #(#bounds,)*),
        None => quote!(where #(#bounds,)*),
    };
    let init_body = match &init {
        Some(path) => quote!(#path(_device, _seed, prefix)),
        None => quote!(::kiln::dynamic::module::built_by_constructor(prefix)),
    };
    Ok(quote! {
        impl #impl_generics #m::Module<#backend> for #name #ty_generics #where_all {
            type Grads = ::kiln::dynamic::Gradients<#backend>;

            fn init_named(
                _device: &<#backend as ::kiln::tensor::Backend>::Device,
                _seed: u64,
                prefix: &str,
            ) -> ::kiln::tensor::Result<Self> {
                #init_body
            }

            fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(#m::Slot<'_, #backend>)) {
                #(self.#idents.visit_params(&#m::join(prefix, #names), f);)*
            }

            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(#m::Slot<'_, #backend>)) {
                #(self.#idents.visit_buffers(&#m::join(prefix, #names), f);)*
            }

            fn update_params(
                &mut self,
                grads: &Self::Grads,
                prefix: &str,
                f: &mut #m::UpdateFn<'_, #backend>,
            ) -> ::kiln::tensor::Result<()> {
                #(#m::with_name(prefix, #names, |name| self.#idents.update_params(grads, name, f))?;)*
                Ok(())
            }

            fn load_named(
                &mut self,
                prefix: &str,
                get: &mut #m::LoadFn<'_, #backend>,
            ) -> ::kiln::tensor::Result<()> {
                #(self.#idents.load_named(&#m::join(prefix, #names), get)?;)*
                Ok(())
            }
        }
    })
}
