//! `kiln-import MODEL.onnx [--name NAME] [--out-dir DIR]`: writes `#[model]` source
//! (`<stem>.rs`) and its checkpoint (`<stem>.safetensors`) for an ONNX model.

use kiln_import::shown;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: kiln-import MODEL.onnx [--name NAME] [--out-dir DIR]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut model, mut name, mut out_dir) = (None, None, PathBuf::from("."));
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let parsed = match arg.as_str() {
            "--name" => value("--name").map(|v| name = Some(v)),
            "--out-dir" => value("--out-dir").map(|v| out_dir = PathBuf::from(v)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            flag if flag.starts_with('-') => Err(format!("unknown flag `{}`", shown(flag))),
            path if model.is_none() => {
                model = Some(PathBuf::from(path));
                Ok(())
            }
            extra => Err(format!(
                "one model at a time (`{}` is a second)",
                shown(extra)
            )),
        };
        if let Err(e) = parsed {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let Some(model) = model else {
        eprintln!("error: no model named\n{USAGE}");
        return ExitCode::from(2);
    };
    match kiln_import::import(&model, &out_dir, name.as_deref()) {
        Ok(done) => {
            println!(
                "{}: `{}` in {}, its checkpoint {}",
                shown(&model.display().to_string()),
                done.name,
                shown(&done.source.display().to_string()),
                shown(&done.checkpoint.display().to_string())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", shown(&model.display().to_string()));
            ExitCode::FAILURE
        }
    }
}
