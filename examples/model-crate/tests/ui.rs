//! The mistakes a user of this crate's parts can make, with the exact messages: each
//! case composes `kiln_example_model::Residual` into a model of its own.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
