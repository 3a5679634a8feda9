//! Imports `model/decoder.onnx` (a small causal decoder PyTorch exported) into
//! `$OUT_DIR/decoder.rs`, a `#[model]` struct and its `forward`, and
//! `$OUT_DIR/decoder.safetensors`, its checkpoint. A file the importer refuses fails
//! the build with its one-line reason.

fn main() {
    println!("cargo::rerun-if-changed=model/decoder.onnx");
    let Some(out) = std::env::var_os("OUT_DIR") else {
        println!("cargo::error=OUT_DIR is not set (run this through cargo)");
        return;
    };
    if let Err(e) = kiln_import::import("model/decoder.onnx", &out, None) {
        println!("cargo::error=model/decoder.onnx: {e}");
    }
}
