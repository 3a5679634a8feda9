//! `docs/methods.md` is generated from the op and method tables: every method a model
//! body can call on a tensor, with its call form and meaning. This test fails when the
//! file is not what the tables give; `KILN_BLESS=1 cargo test --test methods_doc`
//! rewrites it.

use kiln::tensor::{BinaryOp, CmpOp, Method, UnaryOp};
use std::fmt::Write;

fn render() -> String {
    let mut s = String::new();
    s.push_str(
        "# Tensor methods\n\n\
         Generated from Kiln's op and method tables (`kiln_tensor::for_each_method!`, \
         `for_each_unary!`, `for_each_binary!`, `for_each_compare!`) by \
         `tests/methods_doc.rs`; do not edit by hand. What each method does to shapes \
         is checked where it is called: in a `#[model]` body when the program compiles \
         (or, for a `Dyn` size, when it runs), and on typed, raw and dynamic tensors \
         when it runs, with the same words. The [guide](guide.md) shows them in use.\n\n\
         ## Methods\n\n\
         | in a model body | what it does |\n|---|---|\n",
    );
    for m in Method::ALL {
        let call = m.form().spelling(m.name()).replace(" or ", "` or `x");
        writeln!(s, "| `x{call}` | {} |", m.doc().replace('|', "\\|")).unwrap();
    }
    s.push_str(
        "\n## Elementwise ops of one tensor\n\n\
         Called as `x.name()`; the result has the input's shape and dtype.\n\n\
         | method | dtypes |\n|---|---|\n",
    );
    for op in UnaryOp::ALL {
        writeln!(s, "| `x.{}()` | {:?} |", op.method(), op.dtypes()).unwrap();
    }
    s.push_str(
        "\n## Elementwise ops of two tensors\n\n\
         `a + b`, `a - b`, `a * b`, `a / b` in model bodies, or with a number on either \
         side; the others as methods. They broadcast as NumPy does, expanding one operand \
         at most: `[B, 1] - [B]`, an outer product, is an error (write it with \
         `broadcast_to`).\n\n\
         | method | dtypes |\n|---|---|\n",
    );
    for op in BinaryOp::ALL {
        writeln!(s, "| `a.{}(b)` | {:?} |", op.method(), op.dtypes()).unwrap();
    }
    s.push_str("\n## Comparisons (bool results, broadcasting)\n\n| op |\n|---|\n");
    for op in CmpOp::ALL {
        writeln!(s, "| `{}` |", op.name()).unwrap();
    }
    s
}

#[test]
fn the_methods_page_is_generated_from_the_tables() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/methods.md");
    let want = render();
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/methods.md is not what the tables give: run \
         `KILN_BLESS=1 cargo test --test methods_doc`"
    );
}
