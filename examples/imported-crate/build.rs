//! Imports `model/decoder.onnx` (a small causal decoder PyTorch exported) into
//! `$OUT_DIR/decoder.rs`, a `#[model]` struct and its `forward`, and
//! `$OUT_DIR/decoder.safetensors`, its checkpoint. A file the importer refuses fails
//! the build with its one-line reason.
//!
//! It also imports a hostile copy of the same decoder into `$OUT_DIR/hostile.rs`:
//! its file name, producer and graph input and output names hold newlines, comment
//! ends, quotes, Unicode line separators and bidirectional overrides, each written
//! to turn the rest of its line into code if copied raw. The crate compiles that
//! source too, so an importer that let file text out of a comment breaks the build.

use kiln_import::onnx;
use prost::Message;
use std::path::Path;

/// Text that would become code in a generated comment, were it copied raw.
const HOSTILE: &str =
    "x\npub fn injected() {}\r\n*/ /* \" ' ` \\ \u{2028}pub fn also() {}\u{2029}\u{202e}\u{1b}[2J";

fn main() {
    println!("cargo::rerun-if-changed=model/decoder.onnx");
    let Some(out) = std::env::var_os("OUT_DIR") else {
        println!("cargo::error=OUT_DIR is not set (run this through cargo)");
        return;
    };
    if let Err(e) = kiln_import::import("model/decoder.onnx", &out, None) {
        println!("cargo::error=model/decoder.onnx: {e}");
    }
    if let Err(e) = import_hostile(Path::new(&out)) {
        println!("cargo::error=the hostile decoder: {}", e.escape_debug());
    }
}

/// The decoder with hostile text in every name the importer may write into comments,
/// imported into `out/hostile.rs` (its checkpoint is the decoder's).
fn import_hostile(out: &Path) -> Result<(), String> {
    let bytes = std::fs::read("model/decoder.onnx").map_err(|e| e.to_string())?;
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    m.producer_name = Some(HOSTILE.into());
    m.producer_version = Some(HOSTILE.into());
    let g = m.graph.as_mut().ok_or("no graph")?;
    let (input, output) = (
        g.input[0].name().to_string(),
        g.output[0].name().to_string(),
    );
    let rename = |name: &mut String| {
        if *name == input || *name == output {
            *name = format!("{name}{HOSTILE}");
        }
    };
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        if let Some(n) = v.name.as_mut() {
            rename(n);
        }
    }
    for node in &mut g.node {
        node.input
            .iter_mut()
            .chain(node.output.iter_mut())
            .for_each(rename);
    }
    let dir = out.join("hostile");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // A file name holds anything but a slash.
    let file = dir.join(format!("hostile{}.onnx", HOSTILE.replace('/', "")));
    std::fs::write(&file, m.encode_to_vec()).map_err(|e| e.to_string())?;
    let done = kiln_import::import(&file, &dir, None).map_err(|e| e.to_string())?;
    std::fs::copy(&done.source, out.join("hostile.rs")).map_err(|e| e.to_string())?;
    Ok(())
}
