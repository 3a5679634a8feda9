//! Every compile-time error a Kiln user can meet, with its exact message, and models
//! that must build (so trybuild runs a full build, which also evaluates the typed
//! API's post-monomorphization checks).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
