//! `kiln::embed!(Model, "weights.safetensors")`: a checkpoint built into the program,
//! checked against the model when the program compiles. The file's header is read
//! at build time and every tensor's name, dims and dtype compared with the model's
//! parameters and buffers by the rules a load applies (`kiln_safetensors::fit_problems`); a
//! missing, extra or mis-shaped tensor is a compile error naming it and both sides.
//!
//! `embed!` resolves the path (relative to the file that calls it, as
//! `include_bytes!` does; `concat!` of literals and `env!`, for a build script's
//! `OUT_DIR`, read as it expands) and asks the model's definition macro for the model, which
//! calls `model_impl!` back with `embed { .. }` and the definitions of the model and
//! its nested models; [`expand_embed`] does the rest.

use crate::dsl::{model_name, FieldKind};
use crate::model::parse_fields;
use crate::model::Def;
use kiln_safetensors::{fit_problems, header_entries, int8_entries, TensorEntry};
use kiln_tensor::nn::join;
use kiln_tensor::DType;
use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{LitStr, Token};

/// `embed!`'s arguments: the model's path, the file, and an option: `foreign` for a
/// file written by another tool (PyTorch), which has no checksums to verify, or `int8`
/// for the model's int8 checkpoint (`kiln-quantize`'s).
pub struct EmbedArgs {
    model: syn::Path,
    file: LitStr,
    option: Option<syn::Ident>,
}

/// `, foreign` or `, int8`, if given.
fn parse_option(input: ParseStream) -> syn::Result<Option<syn::Ident>> {
    if input.parse::<Option<Token![,]>>()?.is_none() || input.is_empty() {
        return Ok(None);
    }
    let option: syn::Ident = input.parse()?;
    if option != "foreign" && option != "int8" {
        return Err(syn::Error::new(
            option.span(),
            format!("`{option}` is not an option of embed!: the options are `foreign`, for a file another tool wrote (no checksums), and `int8`, for kiln-quantize's int8 checkpoint"),
        ));
    }
    input.parse::<Option<Token![,]>>()?;
    Ok(Some(option))
}

/// The file's path: a string literal, or `concat!` of literals and `env!("VAR")`
/// (`concat!(env!("OUT_DIR"), "/model.safetensors")` for a checkpoint a build script
/// wrote), read when the macro expands as `include_bytes!` would.
fn parse_file(input: ParseStream) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        return input.parse();
    }
    let call: syn::Macro = input.parse()?;
    let wanted = "`embed!` takes the checkpoint's path as a string literal or `concat!(env!(\"OUT_DIR\"), \"/model.safetensors\")`";
    if !call.path.is_ident("concat") {
        return Err(syn::Error::new_spanned(&call, wanted));
    }
    let parts = call
        .parse_body_with(syn::punctuated::Punctuated::<syn::Expr, Token![,]>::parse_terminated)?;
    let mut path = String::new();
    for part in &parts {
        match part {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => path.push_str(&s.value()),
            syn::Expr::Macro(m) if m.mac.path.is_ident("env") => {
                let var: LitStr = m.mac.parse_body()?;
                let value = std::env::var(var.value()).map_err(|_| {
                    syn::Error::new_spanned(
                        m,
                        format!(
                            "environment variable `{}` is not set when this compiles (cargo sets `OUT_DIR` for a crate with a build script)",
                            var.value()
                        ),
                    )
                })?;
                path.push_str(&value);
            }
            other => return Err(syn::Error::new_spanned(other, wanted)),
        }
    }
    Ok(LitStr::new(&path, call.path.span()))
}

impl Parse for EmbedArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let model = input.parse()?;
        input.parse::<Token![,]>()?;
        let file = parse_file(input)?;
        let option = parse_option(input)?;
        Ok(EmbedArgs {
            model,
            file,
            option,
        })
    }
}

/// What `model_impl!` receives: `embed { Model, "/abs/path", "as written" [, option] }`.
pub struct EmbedRequest {
    model: syn::Path,
    resolved: LitStr,
    written: LitStr,
    option: Option<syn::Ident>,
}

impl Parse for EmbedRequest {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let model = input.parse()?;
        input.parse::<Token![,]>()?;
        let resolved = input.parse()?;
        input.parse::<Token![,]>()?;
        let written = input.parse()?;
        let option = parse_option(input)?;
        Ok(EmbedRequest {
            model,
            resolved,
            written,
            option,
        })
    }
}

/// `embed!` itself: resolves the file's path and asks the model's definition macro
/// for the model (`resolve` turns the path as written into an absolute one).
pub fn request(args: EmbedArgs, resolve: impl FnOnce(&str) -> String) -> TokenStream {
    let EmbedArgs {
        model,
        file,
        option,
    } = args;
    let resolved = LitStr::new(&resolve(&file.value()), file.span());
    let callee = crate::model::bare_path(&model);
    let option = option.map(|f| quote!(, #f));
    quote!(#callee! { embed { #model, #resolved, #file #option } })
}

/// The embedded checkpoint of the model `defs[0]` (its nested models after it), or
/// compile errors naming every tensor that does not fit.
pub fn expand_embed(req: EmbedRequest, defs: Vec<Def>) -> TokenStream {
    let EmbedRequest {
        model,
        resolved,
        written,
        option,
    } = req;
    let fail = |msg: String| syn::Error::new(written.span(), msg).to_compile_error();
    let name = model_name(&model);
    let Some(def) = defs.iter().find(|d| d.item.ident == name) else {
        return fail(format!("`{name}` gave no definition to embed weights into"));
    };
    if !def.item.generics.params.is_empty() {
        return fail(format!(
            "`{name}` is a model definition with sizes; embed weights into one of its instances"
        ));
    }
    let mut params = Vec::new();
    let mut buffers = Vec::new();
    if let Err(e) = model_tensors(&def.item, "", &defs, &mut params, &mut buffers) {
        return fail(e);
    }
    params.extend(buffers);
    let shown = written.value();
    let held = match header_entries(resolved.value()) {
        Ok(h) => h,
        // Named as written: the resolved path depends on where the source lies.
        Err(e) => {
            let e = e.to_string().replace(&resolved.value(), &shown);
            return fail(format!("cannot embed `{shown}`: {e}"));
        }
    };
    let int8 = option.as_ref().is_some_and(|o| o == "int8");
    // An int8 checkpoint holds the model's weights as int8 with their scales.
    let wanted = if int8 { int8_entries(&params) } else { params };
    let problems = fit_problems(&wanted, &held);
    // One error naming every mismatch: several `compile_error!`s in expression
    // position would not parse as one expression.
    match problems.as_slice() {
        [] => {}
        [p] => return fail(format!("`{shown}` does not fit `{name}`: {p}")),
        all => {
            let list: Vec<String> = all.iter().map(|p| format!("\n  - {p}")).collect();
            return fail(format!(
                "`{shown}` does not fit `{name}`: {} tensors differ:{}",
                all.len(),
                list.concat()
            ));
        }
    }
    let doc = format!("The weights of `{shown}`, checked against `{name}` at build time.");
    if int8 {
        return quote! {
            {
                #[doc = #doc]
                struct EmbeddedInt8Weights;
                impl EmbeddedInt8Weights {
                    /// The int8 checkpoint built into the program, each tensor checked
                    /// against its checksum and each weight against its scales.
                    fn checkpoint(
                        &self,
                    ) -> ::kiln::tensor::Result<::kiln::train::checkpoint::int8::Int8Checkpoint> {
                        static BYTES: &[u8] = include_bytes!(#resolved);
                        ::kiln::train::checkpoint::int8::read_int8_bytes(#written, BYTES)
                    }
                }
                EmbeddedInt8Weights
            }
        };
    }
    let load = match option {
        Some(_) => quote!(::kiln::train::checkpoint::load_bytes_foreign),
        None => quote!(::kiln::train::checkpoint::load_bytes),
    };
    quote! {
        {
            #[doc = #doc]
            struct EmbeddedWeights;
            impl EmbeddedWeights {
                /// The model on `device`, holding the embedded weights.
                fn load<Be: ::kiln::tensor::Backend>(
                    &self,
                    device: &Be::Device,
                ) -> ::kiln::tensor::Result<#model<Be>> {
                    // Aligned, so the CPU backend reads the tensors in place.
                    static BYTES: &::kiln::train::checkpoint::AlignedBytes<[u8]> =
                        &::kiln::train::checkpoint::AlignedBytes(*include_bytes!(#resolved));
                    // Every value is replaced: nothing is drawn first.
                    let mut model = ::kiln::tensor::nn::zero_initialised(|| {
                        <#model<Be> as ::kiln::tensor::nn::Module<Be>>::init(device, 0)
                    })?;
                    #load(&mut model, #written, &BYTES.0)?;
                    Ok(model)
                }
            }
            EmbeddedWeights
        }
    }
}

/// The parameters and buffers of the model `item` under `prefix`, as a checkpoint
/// names them, nested models through their definitions in `defs`.
fn model_tensors(
    item: &syn::ItemStruct,
    prefix: &str,
    defs: &[Def],
    params: &mut Vec<TensorEntry>,
    buffers: &mut Vec<TensorEntry>,
) -> Result<(), String> {
    let fields = parse_fields(item).map_err(|e| e.to_string())?;
    for f in fields {
        field_tensors(
            &f.kind,
            &join(prefix, &f.ident.to_string()),
            defs,
            params,
            buffers,
        )?;
    }
    Ok(())
}

fn field_tensors(
    kind: &FieldKind,
    key: &str,
    defs: &[Def],
    params: &mut Vec<TensorEntry>,
    buffers: &mut Vec<TensorEntry>,
) -> Result<(), String> {
    match kind {
        FieldKind::Layer(spec) => {
            for p in spec.params() {
                params.push(TensorEntry::new(&join(key, p.name), &p.dims, DType::F32));
            }
            for b in spec.buffers() {
                buffers.push(TensorEntry::new(&join(key, b.name), &b.dims, DType::F32));
            }
        }
        FieldKind::Param(dims) => params.push(TensorEntry::new(key, dims, DType::F32)),
        FieldKind::Array(inner, n) => {
            for i in 0..*n {
                field_tensors(inner, &join(key, &i.to_string()), defs, params, buffers)?;
            }
        }
        FieldKind::Model(path) => {
            let name = model_name(path);
            let def = defs
                .iter()
                .find(|d| d.item.ident == name)
                .ok_or_else(|| format!("the definition of `{name}` (field `{key}`) did not arrive"))?;
            model_tensors(&def.item, key, defs, params, buffers)?;
        }
        FieldKind::Dynamic(path) => {
            return Err(format!(
                "`{key}` is a part on the dynamic path (`{}`), whose tensors are known only when it is built; embed! checks models planned at build time",
                model_name(path)
            ))
        }
    }
    Ok(())
}
