//! The CPU's row passes ([`kiln_tensor::rows`]) against an f64 reference: a row sum,
//! its mean in place, the squared deviations into scratch and their sum, and the
//! centred rows times a broadcast weight, over contiguous rows, over rows of a
//! permuted view (blocks that stop where its rows stop being evenly apart), over rows
//! whose elements lie apart (a transpose), in one block and in many (parallel); and
//! passes that read what is not written yet, or write a reduction into whole rows,
//! refused.

use kiln_cpu::{Cpu, CpuDevice, CpuStorage};

use kiln_tensor::rows::{RowPass, RowPhase, RowRead};
use kiln_tensor::testing::rows::layer_norm;
use kiln_tensor::{Backend, DType, RawTensor, ReduceOp, Result, View};

fn random(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    kiln_tensor::testing::lcg_tensor(dims, seed, &CpuDevice)
}

/// Runs `pass` on `x` (`[.., W]`, any layout) and `w` (`[W]`), checks it ran as a pass,
/// and returns its outputs.
fn run(pass: &RowPass, x: &RawTensor<Cpu>, w: &RawTensor<Cpu>) -> Result<Vec<Vec<f32>>> {
    let w = w.broadcast_to(x.dims())?;
    let views: [View<'_, Cpu>; 2] = [x.view(), w.view()];
    let mut outs: Vec<CpuStorage> = pass
        .whole_rows
        .iter()
        .map(|&whole| {
            Cpu::alloc(
                &CpuDevice,
                DType::F32,
                pass.rows * if whole { pass.width } else { 1 },
            )
        })
        .collect::<Result<_>>()?;
    let mut refs: Vec<&mut CpuStorage> = outs.iter_mut().collect();
    assert!(
        Cpu::fused_rows(&CpuDevice, pass, &views, &mut refs)?,
        "the pass ran"
    );
    Ok(outs
        .iter()
        .map(|o| match o {
            CpuStorage::F32(v) => v.to_vec(),
            other => panic!("unexpected dtype {}", other.dtype()),
        })
        .collect())
}

fn check(x: &RawTensor<Cpu>, w: &RawTensor<Cpu>) -> Result<()> {
    let dims = x.dims().to_vec();
    let width = *dims.last().expect("rank 3");
    let rows = x.numel() / width;
    let got = run(&layer_norm(rows, width), x, w)?;
    let (xs, ws) = (x.to_vec::<f32>()?, w.to_vec::<f32>()?);
    for r in 0..rows {
        let row: Vec<f64> = xs[r * width..(r + 1) * width]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mean = row.iter().sum::<f64>() / width as f64;
        let ss: f64 = row.iter().map(|v| (v - mean) * (v - mean)).sum();
        let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs());
        assert!(
            close(got[0][r], mean),
            "{dims:?} row {r}: mean {} vs {mean}",
            got[0][r]
        );
        assert!(
            close(got[1][r], ss),
            "{dims:?} row {r}: {} vs {ss}",
            got[1][r]
        );
        for (j, v) in row.iter().enumerate() {
            let want = (v - mean) * ws[j] as f64;
            let g = got[2][r * width + j];
            assert!(close(g, want), "{dims:?} row {r}[{j}]: {g} vs {want}");
        }
    }
    Ok(())
}

#[test]
fn a_pass_computes_each_phase_for_every_row() -> Result<()> {
    // One block; rows that do not fill the last block; many blocks in parallel.
    for (dims, seed) in [
        ([2, 3, 24], 1),
        ([3, 37, 130], 2),
        ([8, 300, 64], 3),
        ([2, 3, 40000], 4),
    ] {
        check(&random(&dims, seed)?, &random(&dims[2..], seed + 10)?)?;
        // Rows of a permuted view `[B, T, W]` of `[T, B, W]`: evenly apart only
        // within one batch entry.
        let t = random(&[dims[1], dims[0], dims[2]], seed + 20)?.permute(&[1, 0, 2])?;
        check(&t, &random(&dims[2..], seed + 30)?)?;
        // Rows read across a transpose (elements of a row apart): staged for the sums.
        let t = random(&[dims[0], dims[2], dims[1]], seed + 40)?.permute(&[0, 2, 1])?;
        check(&t, &random(&dims[2..], seed + 50)?)?;
    }
    Ok(())
}

#[test]
fn a_pass_that_reads_what_is_not_written_or_reduces_into_rows_is_refused() -> Result<()> {
    let x = random(&[4, 8], 5)?;
    let w = random(&[8], 6)?;
    let mut early = layer_norm(4, 8);
    early.phases.swap(0, 2);
    let mut into_rows = layer_norm(4, 8);
    into_rows.phases[0] = RowPhase::Reduce {
        op: ReduceOp::Sum,
        input: RowRead::Input(0),
        out: 2,
    };
    let mut scratch_late = layer_norm(4, 8);
    scratch_late.phases.swap(2, 1);
    for (name, bad) in [
        ("reads a mean not yet computed", early),
        ("reduces into whole rows", into_rows),
        ("reads scratch after another phase", scratch_late),
    ] {
        let err = match run(&bad, &x, &w) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name}: the pass ran"),
        };
        assert!(err.contains("row pass"), "{name}: {err}");
    }
    Ok(())
}
