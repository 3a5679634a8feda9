//! What a hostile ONNX file cannot do to kiln-import: write code into the generated
//! source through the names it holds, make the import read without end, name the
//! model `Self`, or leave a source without its checkpoint when a write fails.

use kiln_import::onnx;
use kiln_import::{import, model_name, read, ImportError};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fresh folder of this test's own under the target dir.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Text that becomes code, ends a comment or string, or moves a terminal's cursor,
/// were it copied raw into a generated comment or printed raw.
const HOSTILE: &[&str] = &[
    "\npub fn injected() {}\n",
    "\r\npub fn injected() {}",
    "*/ pub fn injected() {} /*",
    "\" ' ` \\",
    "\u{2028}pub fn injected() {}\u{2029}",
    "\u{202e}\u{2066}",
    "\u{1b}[2J\u{7}",
];

/// The MLP fixture with every hostile text in its producer and in the names of its
/// graph input and output, written as `dir/<stem>.onnx`.
fn hostile_mlp(dir: &Path, stem: &str) -> PathBuf {
    let all = HOSTILE.concat();
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    m.producer_name = Some(all.clone());
    m.producer_version = Some(all.clone());
    let g = m.graph.as_mut().unwrap();
    let (input, output) = (
        g.input[0].name().to_string(),
        g.output[0].name().to_string(),
    );
    let rename = |name: &mut String| {
        if *name == input || *name == output {
            *name = format!("{name}{all}");
        }
    };
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        rename(v.name.as_mut().unwrap());
    }
    for node in &mut g.node {
        node.input
            .iter_mut()
            .chain(node.output.iter_mut())
            .for_each(rename);
    }
    let path = dir.join(format!("{stem}.onnx"));
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path
}

#[test]
fn names_from_the_file_never_leave_the_generated_comments() {
    let dir = scratch("names");
    // A file name holds anything but a slash.
    let path = hostile_mlp(&dir, &format!("mlp{}", HOSTILE.concat().replace('/', "")));
    let done = import(&path, &dir, None).unwrap();
    let source = std::fs::read_to_string(&done.source).unwrap();
    // Every line that holds file text is a comment, all of it printable ASCII.
    for line in source.lines() {
        assert!(
            line.chars().all(|c| (' '..='~').contains(&c)),
            "a line with a character outside printable ASCII: {line:?}"
        );
        if line.contains("injected()") {
            assert!(
                line.trim_start().starts_with("//"),
                "code from the file: {line:?}"
            );
        }
    }
    assert!(!source.contains('\r'));
    // Parsed as Rust, the file is the import and the model: nothing more.
    let file = syn::parse_file(&source).unwrap();
    let items: Vec<String> = file
        .items
        .iter()
        .map(|item| match item {
            syn::Item::Use(_) => "use".to_string(),
            syn::Item::Struct(s) => format!("struct {}", s.ident),
            syn::Item::Impl(i) => format!("impl with {} items", i.items.len()),
            _ => "something else".to_string(),
        })
        .collect();
    assert_eq!(
        items,
        ["use", &format!("struct {}", done.name), "impl with 1 items"],
        "{source}"
    );
    // The struct's documentation names the file, escaped.
    assert!(source.contains("\\n"), "{source}");
    assert!(source.contains("\\u{2028}"), "{source}");
}

#[test]
fn errors_print_names_from_the_file_escaped() {
    // A node that reads a value nothing produces, its name hostile.
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
    let mut m = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    let node = &mut m.graph.as_mut().unwrap().node[0];
    node.input[0] = format!("missing{}", HOSTILE.concat());
    let e = kiln_import::decode(&m.encode_to_vec())
        .unwrap_err()
        .to_string();
    assert!(e.contains("reads `missing"), "{e}");
    assert!(
        !e.chars()
            .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{202e}'),
        "{e:?}"
    );
    assert!(e.contains("\\u{1b}[2J"), "{e}");
}

#[test]
fn a_device_or_a_fifo_is_refused_not_read() {
    let e = read("/dev/zero").unwrap_err().to_string();
    assert!(e.contains("`/dev/zero` is not a regular file"), "{e}");
    let dir = scratch("fifo");
    let fifo = dir.join("model.onnx");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Nothing writes to the FIFO: opening it to read would block if it were read.
    let e = std::thread::scope(|s| {
        let reader = s.spawn(|| read(&fifo).map(|_| ()).unwrap_err().to_string());
        // Unblocks an open that waits for a writer, should the reader be waiting.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        reader.join().unwrap()
    });
    assert!(e.contains("is not a regular file"), "{e}");
    let e = read(&dir).unwrap_err().to_string();
    assert!(e.contains("is not a regular file"), "{e}");
}

#[test]
fn the_model_is_never_named_what_rust_or_its_source_needs() {
    assert_eq!(model_name("self"), "SelfModel");
    assert_eq!(model_name("tensor"), "TensorModel");
    assert_eq!(model_name("linear"), "LinearModel");
    assert_eq!(model_name("mlp"), "Mlp");
    let dir = scratch("self");
    let path = dir.join("self.onnx");
    std::fs::copy(fixture("mlp.onnx"), &path).unwrap();
    let done = import(&path, &dir, None).unwrap();
    assert_eq!(done.name, "SelfModel");
    let source = std::fs::read_to_string(&done.source).unwrap();
    assert!(source.contains("pub struct SelfModel {"), "{source}");
    for name in ["Self", "Tensor", "Linear", "Dyn"] {
        let e = import(&path, &dir, Some(name)).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`{name}` cannot name the model")),
            "{e}"
        );
    }
}

#[test]
fn a_write_that_fails_leaves_no_source_without_its_checkpoint() {
    let dir = scratch("writes");
    let path = dir.join("mlp.onnx");
    std::fs::copy(fixture("mlp.onnx"), &path).unwrap();
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // The checkpoint's path is a folder: refused by name before anything is written.
    std::fs::create_dir_all(out.join("mlp.safetensors")).unwrap();
    let e = import(&path, &out, None).unwrap_err();
    assert!(matches!(e, ImportError::Write { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.starts_with("cannot write `"), "{e}");
    assert!(
        e.contains("mlp.safetensors` is a folder, not a regular file"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["mlp.safetensors"], "nothing else written");
    // A folder that does not exist: a write error naming the source, nothing left.
    let e = import(&path, dir.join("missing"), None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("cannot write `"), "{e}");
    assert!(e.contains("missing/mlp.rs"), "{e}");
    // An output that is the input itself.
    let as_rs = dir.join("model.rs");
    std::fs::copy(fixture("mlp.onnx"), &as_rs).unwrap();
    let e = import(&as_rs, &dir, None).unwrap_err().to_string();
    assert!(e.contains("would overwrite its input"), "{e}");
    assert_eq!(
        std::fs::read(&as_rs).unwrap(),
        std::fs::read(fixture("mlp.onnx")).unwrap()
    );
    // A FIFO as an output is refused, never replaced (as root, a rename would
    // replace a device node just as well).
    let fifo_dir = dir.join("fifo");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let made = Command::new("mkfifo")
        .arg(fifo_dir.join("mlp.rs"))
        .status()
        .unwrap();
    assert!(made.success());
    let e = import(&path, &fifo_dir, None).unwrap_err().to_string();
    assert!(
        e.contains("mlp.rs` is a FIFO (named pipe), not a regular file"),
        "{e}"
    );
    let kind = std::fs::symlink_metadata(fifo_dir.join("mlp.rs"))
        .unwrap()
        .file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind));
}
