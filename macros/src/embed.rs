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
use kiln_safetensors::{
    check_int8, fit_problems, header_entries, Checksums, Reader, TensorEntry, QUANTIZATION_KEY,
};
use kiln_tensor::nn::join;
use kiln_tensor::{DType, Precision};
use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{LitStr, Token};

/// The attribute an instance's definition carries its precision in
/// (`#[kiln_precision = "int8"]`), so that `embed!` into it expects the tensors that
/// precision holds.
pub const PRECISION_MARK: &str = "kiln_precision";

/// The precision a definition was marked with (f32 when unmarked).
fn marked_precision(item: &syn::ItemStruct) -> Result<Precision, String> {
    let Some(attr) = item
        .attrs
        .iter()
        .find(|a| a.path().is_ident(PRECISION_MARK))
    else {
        return Ok(Precision::F32);
    };
    let value = match &attr.meta {
        syn::Meta::NameValue(syn::MetaNameValue {
            value:
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }),
            ..
        }) => s.value(),
        _ => return Err("a malformed precision mark".into()),
    };
    Precision::parse(&value).map_err(|e| e.to_string())
}

/// `embed!`'s arguments: the model's path, the file, and an option: `foreign` for a
/// file written by another tool (PyTorch), which has no checksums to verify.
pub struct EmbedArgs {
    model: syn::Path,
    file: LitStr,
    option: Option<syn::Ident>,
}

/// `, foreign`, if given (or `, int8`, which `request` refuses with what to write
/// instead).
fn parse_option(input: ParseStream) -> syn::Result<Option<syn::Ident>> {
    if input.parse::<Option<Token![,]>>()?.is_none() || input.is_empty() {
        return Ok(None);
    }
    let option: syn::Ident = input.parse()?;
    // `int8` is answered by `request`, which knows the model's name.
    if option != "foreign" && option != "int8" {
        return Err(syn::Error::new(
            option.span(),
            format!("`{option}` is not an option of embed!: the option is `foreign`, for a file another tool wrote (no checksums)"),
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
    if let Some(int8) = option.as_ref().filter(|o| *o == "int8") {
        let name = model_name(&model);
        let msg = format!(
            "an int8 checkpoint is embedded into the model's int8 instance: declare `#[model(precision = int8)] type {name}Int8 = {name};` and write `kiln::embed!({name}Int8, {:?})`",
            file.value()
        );
        return syn::Error::new(int8.span(), msg).to_compile_error();
    }
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
    let precision = match marked_precision(&def.item) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let mut params = Vec::new();
    let mut buffers = Vec::new();
    let tensors = Tensors {
        defs: &defs,
        precision,
    };
    if let Err(e) = tensors.of_model(&def.item, "", &mut params, &mut buffers) {
        return fail(e);
    }
    params.extend(buffers);
    let shown = written.value();
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
    if let Some(msg) = missing_file(&shown, &resolved.value(), manifest.as_deref()) {
        return fail(msg);
    }
    let held = match header_entries(resolved.value()) {
        Ok(h) => h,
        // Named as written: the resolved path depends on where the source lies.
        Err(e) => {
            let e = e.to_string().replace(&resolved.value(), &shown);
            return fail(format!("cannot embed `{shown}`: {e}"));
        }
    };
    let problems = fit_problems(&params, &held);
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
    // The int8 format's rules (label, scales, values, finite floats), by the check
    // every load applies: a bad file is a compile error, not a load error.
    if let Err(e) = check_quantized(&resolved.value(), precision, option.is_some()) {
        // The file is named once, as written.
        let e = e
            .to_string()
            .replace(&format!("`{}`: ", resolved.value()), "");
        let e = e.replace(&resolved.value(), &shown);
        return fail(format!("cannot embed `{shown}` into `{name}`: {e}"));
    }
    let doc = format!("The weights of `{shown}`, checked against `{name}` at build time.");
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

/// Checks the checkpoint at `file` by the int8 format's rules
/// (`kiln_safetensors::check_int8`) when it goes into an int8 instance or says it is
/// quantised; `foreign`: a file without checksums, as `embed!(.., foreign)` takes.
fn check_quantized(file: &str, precision: Precision, foreign: bool) -> kiln_tensor::Result<()> {
    let reader = Reader::open(std::path::Path::new(file))?;
    if precision != Precision::Int8 && !reader.metadata().contains_key(QUANTIZATION_KEY) {
        return Ok(());
    }
    let checksums = if foreign {
        Checksums::IfPresent
    } else {
        Checksums::Required
    };
    reader.require(checksums)?;
    check_int8(&reader, checksums)
}

/// What a model's checkpoint holds: its tensors and their nested models' (through
/// their definitions), as its precision holds them.
struct Tensors<'a> {
    defs: &'a [Def],
    precision: Precision,
}

impl Tensors<'_> {
    /// The parameters and buffers of the model `item` under `prefix`, as a checkpoint
    /// names them.
    fn of_model(
        &self,
        item: &syn::ItemStruct,
        prefix: &str,
        params: &mut Vec<TensorEntry>,
        buffers: &mut Vec<TensorEntry>,
    ) -> Result<(), String> {
        let fields = parse_fields(item).map_err(|e| e.to_string())?;
        for f in fields {
            self.of_field(
                &f.kind,
                &join(prefix, &f.ident.to_string()),
                params,
                buffers,
            )?;
        }
        Ok(())
    }

    fn of_field(
        &self,
        kind: &FieldKind,
        key: &str,
        params: &mut Vec<TensorEntry>,
        buffers: &mut Vec<TensorEntry>,
    ) -> Result<(), String> {
        match kind {
            FieldKind::Layer(spec) => {
                for p in spec.params_in(self.precision) {
                    params.push(TensorEntry::new(&join(key, p.name), &p.dims, p.dtype));
                }
                for b in spec.buffers() {
                    buffers.push(TensorEntry::new(&join(key, b.name), &b.dims, b.dtype));
                }
            }
            FieldKind::Param(dims) => params.push(TensorEntry::new(key, dims, DType::F32)),
            FieldKind::Array(inner, n) => {
                for i in 0..*n {
                    self.of_field(inner, &join(key, &i.to_string()), params, buffers)?;
                }
            }
            FieldKind::Model(path) => {
                let name = model_name(path);
                let def = self
                    .defs
                    .iter()
                    .find(|d| d.item.ident == name)
                    .ok_or_else(|| {
                        format!("the definition of `{name}` (field `{key}`) did not arrive")
                    })?;
                self.of_model(&def.item, key, params, buffers)?;
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
}

/// Where `embed!` looked for a file that is not there, and where it is if the path was
/// written from the crate's root: `None` when `resolved` (the path as written, read
/// from the calling file's folder) exists.
fn missing_file(
    written: &str,
    resolved: &str,
    manifest: Option<&std::path::Path>,
) -> Option<String> {
    let path = std::path::Path::new(resolved);
    if path.exists() {
        return None;
    }
    let shown = match std::path::Path::new(written).is_absolute() {
        true => format!("there is no file at `{written}`"),
        false => {
            let folder = resolved.strip_suffix(written).unwrap_or(resolved);
            format!(
                "there is no file at `{resolved}`: a relative path is read from the folder of the file that calls `embed!` (`{folder}`), as `include_bytes!` reads it"
            )
        }
    };
    let from_root = manifest
        .map(|m| m.join(written))
        .filter(|p| !std::path::Path::new(written).is_absolute() && p.is_file());
    let hint = match from_root {
        Some(_) => format!(
            "; `{written}` is in the crate's root folder: write `concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/{written}\")`"
        ),
        None => String::new(),
    };
    Some(format!("cannot embed `{written}`: {shown}{hint}"))
}

#[cfg(test)]
mod missing_file_tests {
    use super::missing_file;

    #[test]
    fn a_path_from_the_crate_root_is_named_with_where_it_was_looked_for_and_what_to_write() {
        let root = std::env::temp_dir().join(format!("kiln-embed-root-{}", std::process::id()));
        std::fs::create_dir_all(root.join("weights")).unwrap();
        std::fs::write(root.join("weights/mlp.safetensors"), b"x").unwrap();
        let resolved = format!("{}/src/bin/weights/mlp.safetensors", root.display());
        let msg = missing_file("weights/mlp.safetensors", &resolved, Some(&root)).unwrap();
        assert!(
            msg.contains(&format!("there is no file at `{resolved}`")),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("(`{}/src/bin/`)", root.display())),
            "{msg}"
        );
        assert!(
            msg.contains(
                r#"write `concat!(env!("CARGO_MANIFEST_DIR"), "/weights/mlp.safetensors")`"#
            ),
            "{msg}"
        );
        // A path that is nowhere gets no advice about the root.
        let msg = missing_file(
            "weights/other.safetensors",
            &resolved.replace("mlp", "other"),
            Some(&root),
        )
        .unwrap();
        assert!(!msg.contains("CARGO_MANIFEST_DIR"), "{msg}");
        // A file that is there is no mistake.
        let there = root.join("weights/mlp.safetensors");
        assert!(missing_file("x", there.to_str().unwrap(), Some(&root)).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
