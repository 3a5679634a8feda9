//! `kiln-quantize`: writes the int8 checkpoint of an f32 checkpoint Kiln wrote. Each
//! linear layer's and embedding's weight becomes int8 values with one f32 scale per
//! row (per output channel); the rest is kept; every tensor gets its checksum
//! (`kiln::train::checkpoint::int8`).

use clap::Parser;
use kiln::train::checkpoint::int8::{quantize_int8, quantize_int8_foreign};
use kiln::train::checkpoint::{check_not_input, check_output};
use std::path::PathBuf;

/// Quantise a checkpoint's weights to int8 (per-row symmetric scales).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The f32 checkpoint (written by kiln-train or `checkpoint::save`).
    input: PathBuf,
    /// Where to write the int8 checkpoint.
    output: PathBuf,
    /// The checkpoint was written by another tool (PyTorch's save_file) and has no
    /// Kiln checksums: read it unverified (checksums it has are still verified).
    #[arg(long)]
    foreign: bool,
}

fn main() {
    let args = Args::parse();
    // The output's own mistakes, before any reading: the input itself (through a
    // link too), or a device or FIFO the write would replace. The library checks
    // them as well; here they are usage errors.
    let usage = check_not_input("int8 checkpoint", &args.output, &args.input)
        .and_then(|()| check_output("int8 checkpoint", &args.output));
    if let Err(e) = usage {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let quantize = if args.foreign {
        quantize_int8_foreign
    } else {
        quantize_int8
    };
    match quantize(&args.input, &args.output) {
        Ok(r) => println!(
            "{}: {} weights as int8 ({}), {} tensors kept; {:.2} MB of tensors, was {:.2} MB",
            args.output.display(),
            r.quantized.len(),
            // Names from the file, escaped: they reach the terminal.
            r.quantized
                .iter()
                .map(|n| n.escape_debug().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            r.kept.len(),
            r.bytes_after as f64 / 1e6,
            r.bytes_before as f64 / 1e6
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
