//! How the check phase words its messages: source-like text of expressions, errors of
//! the op layer as sentences, and the instance a message came from.

use kiln_tensor::Error;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::Expr;

/// Source-like text of an expression for messages: `self.fc1(x)`, not `self . fc1 (x)`.
pub(crate) fn src(e: &impl ToTokens) -> String {
    let mut s = e.to_token_stream().to_string();
    for (from, to) in [
        (" . ", "."),
        (" (", "("),
        ("( ", "("),
        (" )", ")"),
        (" ,", ","),
        (" :: ", "::"),
        (" [", "["),
        ("[ ", "["),
        (" ]", "]"),
        ("& ", "&"),
        (" ?", "?"),
        (" < ", "<"),
        ("< ", "<"),
        (" >", ">"),
        ("! (", "!("),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// A kiln error as the macro shows it.
pub fn describe(e: &Error) -> String {
    e.to_string()
}

/// A library rule's refusal, as the macro reports it: what kind of mistake, in which
/// op, of which operands (as the user wrote them), then the rule's own words.
pub(crate) fn refusal(op: &str, operands: &[String], e: &Error) -> String {
    let kind = match e {
        Error::Shape { .. } => "shape mismatch",
        Error::DType { .. } => "dtype mismatch",
        _ => "invalid argument",
    };
    let names: Vec<String> = operands.iter().map(|o| format!("`{o}`")).collect();
    format!(
        "{kind} in `{op}` of {}: {}",
        names.join(" and "),
        describe_inner(e)
    )
}

pub(crate) fn describe_inner(e: &Error) -> String {
    match e {
        Error::Shape { msg, .. } | Error::DType { msg, .. } | Error::Invalid { msg, .. } => {
            msg.clone()
        }
        other => other.to_string(),
    }
}

/// Why an expression cannot be in a model method, and what to write instead.
pub(crate) fn unsupported_expression(e: &Expr) -> String {
    let fixed = "a model method is one graph, fixed at build time";
    match e {
        Expr::If(_) | Expr::Match(_) => format!(
            "`{}` is not supported in model methods ({fixed}): compute with tensor ops, or branch in plain Rust around the calls",
            if matches!(e, Expr::If(_)) { "if" } else { "match" }
        ),
        Expr::While(_) | Expr::Loop(_) => format!(
            "`while` and `loop` are not supported in model methods ({fixed}): loop over an array of layers with `for layer in &self.blocks {{ .. }}`"
        ),
        Expr::Try(_) => "`?` is not needed in model methods: the generated method returns a `Result` and passes every error on; remove the `?`".into(),
        Expr::Return(r) => match &r.expr {
            Some(v) => format!(
                "`return` is not supported in model methods: end the body with the value, `{}`, as its last expression",
                src(v)
            ),
            None => "`return` is not supported in model methods: end the body with the value it returns".into(),
        },
        Expr::Closure(_) => "closures are not supported in model methods: write a method of this #[model] impl".into(),
        Expr::Macro(m) => format!(
            "macros (`{}!`) are not supported in model methods",
            src(&m.mac.path)
        ),
        Expr::Reference(_) => "`&` is not needed in model methods: pass tensors by name".into(),
        _ => "this expression is not supported in model methods; see the kiln-macros docs for what bodies may hold".into(),
    }
}

/// `e` as compile errors, each message followed by `context` (which instance it came
/// from), keeping each error's whole span.
pub fn errors_in(e: &syn::Error, context: &str) -> TokenStream {
    use proc_macro2::{Group, Literal, TokenTree};
    fn rewrite(ts: TokenStream, message: &str) -> TokenStream {
        ts.into_iter()
            .map(|t| match t {
                TokenTree::Group(g) => {
                    let mut out = Group::new(g.delimiter(), rewrite(g.stream(), message));
                    out.set_span(g.span());
                    TokenTree::Group(out)
                }
                TokenTree::Literal(l) => {
                    let mut out = Literal::string(message);
                    out.set_span(l.span());
                    TokenTree::Literal(out)
                }
                other => other,
            })
            .collect()
    }
    e.clone()
        .into_iter()
        .map(|one| {
            let message = format!("{one}{context}");
            rewrite(one.to_compile_error(), &message)
        })
        .collect()
}
