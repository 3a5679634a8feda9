//! Expansions pinned: a change to the code `#[model]` generates shows in review as a
//! diff of `macros/tests/snapshots/` — the README's `Mlp` (`readme_mlp.rs`) and one
//! block of the GPT, a model holding a nested model (`gpt_block.rs`).
//! `KILN_BLESS=1 cargo test -p kiln-macros` rewrites them.

use crate::{impls, structs};
use syn::{Item, ItemImpl, ItemStruct};

/// The first Rust block under the README's "A model" heading.
fn readme_model() -> syn::File {
    let readme = include_str!("../../README.md");
    let section = &readme[readme.find("## A model").expect("the README shows a model")..];
    let code = &section[section.find("```rust").expect("a rust block") + "```rust".len()..];
    let code = &code[..code.find("```").expect("the block ends")];
    syn::parse_str(code).expect("the README's model parses")
}

/// The item without its `#[model]` attribute (as the attribute macro receives it).
fn unmarked<T>(mut item: T, attrs: impl Fn(&mut T) -> &mut Vec<syn::Attribute>) -> T {
    attrs(&mut item).retain(|a| !a.path().is_ident("model"));
    item
}

#[test]
fn the_readme_model_expands_as_the_snapshot_shows() {
    let file = readme_model();
    let s: ItemStruct = file
        .items
        .iter()
        .find_map(|i| match i {
            Item::Struct(s) => Some(unmarked(s.clone(), |s| &mut s.attrs)),
            _ => None,
        })
        .expect("a model struct");
    let imp: ItemImpl = file
        .items
        .iter()
        .find_map(|i| match i {
            Item::Impl(i) => Some(unmarked(i.clone(), |i| &mut i.attrs)),
            _ => None,
        })
        .expect("a model impl");
    let mut tokens =
        structs::expand_struct(s.clone(), kiln_tensor::Precision::F32).expect("the struct expands");
    tokens.extend(impls::expand_impl(s, imp, Vec::new()));
    check(
        "readme_mlp.rs",
        "// The expansion of the README's `Mlp` (see macros/src/snapshot.rs).",
        tokens,
    );
}

/// The struct and impl named `name` in `file`, without their `#[model]` attributes.
fn model_named(file: &syn::File, name: &str) -> (ItemStruct, ItemImpl) {
    let s = file
        .items
        .iter()
        .find_map(|i| match i {
            Item::Struct(s) if s.ident == name => Some(unmarked(s.clone(), |s| &mut s.attrs)),
            _ => None,
        })
        .expect("the model's struct");
    let imp = file
        .items
        .iter()
        .find_map(|i| match i {
            Item::Impl(i) if matches!(&*i.self_ty, syn::Type::Path(p) if p.path.is_ident(name)) => {
                Some(unmarked(i.clone(), |i| &mut i.attrs))
            }
            _ => None,
        })
        .expect("the model's impl");
    (s, imp)
}

#[test]
fn a_gpt_block_expands_as_the_snapshot_shows() {
    let gpt: syn::File =
        syn::parse_str(include_str!("../../models/src/gpt.rs")).expect("gpt.rs parses");
    let parts: syn::File =
        syn::parse_str(include_str!("../../models/src/parts.rs")).expect("parts.rs parses");
    let (s, imp) = model_named(&gpt, "GptBlock");
    let (attn_s, attn_imp) = model_named(&parts, "CausalSelfAttention");
    // What `#[model] type TinyBlock = GptBlock<16, 2>;` receives through the block's
    // definition macro: the block's definition, then the one it bundles.
    let input = quote::quote! {
        instance { type TinyBlock = GptBlock<16, 2>; }
        def { #s ; #imp }
        def { #attn_s ; #attn_imp }
    };
    let tokens = crate::model_impl_tokens(input);
    check(
        "gpt_block.rs",
        "// The expansion of `#[model] type TinyBlock = kiln_models::gpt::GptBlock<16, 2>;`: a\n// block with named sizes, holding a `CausalSelfAttention<D, H>` (see macros/src/snapshot.rs).",
        tokens,
    );
}

/// Compares an expansion with its snapshot (or rewrites it under `KILN_BLESS`).
fn check(file: &str, header: &str, tokens: proc_macro2::TokenStream) {
    let expanded: syn::File = syn::parse2(tokens).expect("the expansion is Rust");
    let text = format!("{header}\n{}", prettyplease::unparse(&expanded));
    let path = format!("{}/tests/snapshots/{file}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &text).expect("the snapshot is writable");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if want != text {
        let line = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "the expansion differs from {path} from line {} on (KILN_BLESS=1 rewrites it after review):\n{}",
            line + 1,
            text.lines().skip(line).take(12).collect::<Vec<_>>().join("\n")
        );
    }
}
