#!/usr/bin/env bash
# Regenerates import/src/onnx.rs, the prost messages of ONNX's protobuf schema
# (import/proto/onnx.proto, copied from the `onnx` Python package of the version named
# in the generated file's header). Needs only cargo: protox compiles the schema in
# Rust, so no `protoc` is installed. Run from the repository root.
set -euo pipefail
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "gen-onnx-proto"
version = "0.1.0"
edition = "2021"
publish = false
[dependencies]
prost-build = "0.14"
protox = "0.9"
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() {
    let mut args = std::env::args().skip(1);
    let (dir, out) = (args.next().expect("proto dir"), args.next().expect("out dir"));
    let proto = format!("{dir}/onnx.proto");
    let fds = protox::compile([proto.as_str()], [dir.as_str()]).expect("the schema compiles");
    prost_build::Config::new().out_dir(&out).compile_fds(fds).expect("code generates");
}
RS
(cd "$work" && cargo run -q -- "$root/import/proto" "$work/out")
version=$(python3 -c "import onnx; print(onnx.__version__)" 2>/dev/null || echo "see header")
{
  echo "//! ONNX's protobuf schema as \`prost\` messages, generated from \`import/proto/onnx.proto\`"
  echo "//! (ONNX $version, Apache-2.0) by \`scripts/gen_onnx_proto.sh\` (protox and prost-build);"
  echo "//! not edited by hand. The field docs are ONNX's own comments."
  echo
  cat "$work/out/onnx.rs"
} > "$root/import/src/onnx.rs"
rustfmt --edition 2021 "$root/import/src/onnx.rs"
echo "wrote import/src/onnx.rs"
