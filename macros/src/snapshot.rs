//! The expansion of the README's model, pinned: a change to the code `#[model]`
//! generates shows in review as a diff of `macros/tests/snapshots/readme_mlp.rs`
//! (`KILN_BLESS=1 cargo test -p kiln-macros` rewrites it).

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
    let mut tokens = structs::expand_struct(s.clone()).expect("the struct expands");
    tokens.extend(impls::expand_impl(s, imp, Vec::new()));
    let expanded: syn::File = syn::parse2(tokens).expect("the expansion is Rust");
    let text = format!(
        "// The expansion of the README's `Mlp` (see macros/src/snapshot.rs).\n{}",
        prettyplease::unparse(&expanded)
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/readme_mlp.rs");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(path, &text).expect("the snapshot is writable");
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
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
