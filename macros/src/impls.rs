//! `#[model]` on an impl: each method becomes a typed method of `Model<Be>` (its body
//! lowered, checked, and re-emitted with the inferred types), and each method that
//! returns a scalar also gets `<name>_and_grad`.

use crate::lower::{parse_method, Lower, MethodSig};
use crate::structs::parse_fields;
use crate::train::value_and_grad;
use kiln_tensor::nn::Mode;
use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{ImplItem, ItemImpl, ItemStruct};

/// Expands the impl of a model whose struct is `item`.
pub fn expand_impl(item: ItemStruct, imp: ItemImpl) -> TokenStream {
    let model = &item.ident;
    let fields = match parse_fields(&item) {
        Ok(f) => f,
        // The struct's own expansion already reports these.
        Err(_) => return quote!(),
    };
    let mut errors: Vec<syn::Error> = Vec::new();
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
    for (mi, m) in methods.iter().enumerate() {
        let mut lower = Lower::new(&fields, &methods, Mode::Eval, true);
        let result = lower.lower_method(m);
        let method_errors = std::mem::take(&mut lower.errors);
        if method_errors.is_empty() {
            if let Ok(v) = result {
                let fused = match &v {
                    crate::lower::Val::T(node, _) if !m.ret_tuple => {
                        let name = quote::format_ident!(
                            "__KILN_PLAN_{}",
                            m.name().to_string().to_uppercase()
                        );
                        plans.push((m.name().to_string(), name.clone()));
                        Some(crate::fuse::fuse(
                            &lower.mg,
                            &[*node],
                            2 * mi,
                            &name,
                            &m.consts,
                            &mut natives,
                        ))
                    }
                    _ => None,
                };
                out.push(typed_method(m, &lower.stmts, &v, fused.as_ref(), &fields));
                if m.is_scalar_loss() {
                    match value_and_grad(model, &fields, &methods, m, 2 * mi + 1, &mut natives) {
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
                        Err(es) => errors.extend(es),
                    }
                }
                continue;
            }
        }
        errors.extend(method_errors);
        out.push(stub_method(m));
    }
    let compile_errors = errors.iter().map(|e| e.to_compile_error());
    let natives = natives.module();
    let titles: Vec<String> = plans.iter().map(|(t, _)| format!("{model}::{t}")).collect();
    let consts: Vec<&syn::Ident> = plans.iter().map(|(_, c)| c).collect();
    quote! {
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
        }
        #natives
        #(#compile_errors)*
    }
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
        #[allow(clippy::let_and_return, clippy::redundant_clone)]
        #vis fn #name<#(const #consts: usize),*>(&self, #(#names: &#tys),*) -> ::kiln::tensor::Result<#ret>
    }
}

fn typed_method(
    m: &MethodSig,
    stmts: &[TokenStream],
    v: &crate::lower::Val,
    fused: Option<&crate::fuse::Fused>,
    fields: &[crate::structs::ModelField],
) -> TokenStream {
    let sig = signature(m);
    let value = result_code(v);
    let Some(fused) = fused else {
        return quote! {
            #sig {
                #(#stmts)*
                Ok(#value)
            }
        };
    };
    let device = match m.args.first() {
        Some((a, _)) => quote!(#a.device().clone()),
        None => crate::train::first_param_device(fields)
            .unwrap_or_else(|| quote!(::core::default::Default::default())),
    };
    let (plan_const, run) = (&fused.plan_const, &fused.run);
    quote! {
        #plan_const

        #sig {
            if self.__kiln_plans.fused() {
                let __dev = #device;
                // Evaluation mode draws nothing at random.
                let __seed = 0u64;
                if let ::core::option::Option::Some((__out,)) = #run {
                    return ::kiln::tensor::Tensor::from_raw(__out);
                }
            }
            #(#stmts)*
            Ok(#value)
        }
    }
}

fn result_code(v: &crate::lower::Val) -> TokenStream {
    match v {
        crate::lower::Val::T(_, code) => quote!(#code.clone()),
        crate::lower::Val::Tuple(parts) => {
            let p = parts.iter().map(result_code);
            quote!((#(#p,)*))
        }
        _ => quote!(unreachable_value()),
    }
}

/// A method whose body did not lower keeps its signature (so callers do not see a
/// second error) and a body that never runs: the build has already failed.
fn stub_method(m: &MethodSig) -> TokenStream {
    let sig = signature(m);
    quote! {
        #[allow(unused_variables)]
        #sig {
            ::core::panic!("this model method did not compile")
        }
    }
}
