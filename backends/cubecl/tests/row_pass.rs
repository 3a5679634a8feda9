//! Row passes ([`kiln_tensor::rows`]) on the GPU backends (wgpu in CI, CUDA where a GPU
//! is): a layer norm's forward pass, a softmax and a layer-norm-gradient-like pass
//! (a whole-row output reduced again, an epilogue in place, a per-row input, a
//! minimum) run as one launch give the bits of the same kernels run apart on the same
//! device, and the CPU's pass within rounding; over contiguous rows, offset rows, rows
//! apart, rows under two lead dims and transposed elements, with widths from 2 to past
//! a cube's units. The passes the kernel leaves to its kernels (row starts not evenly
//! apart, a reduction of elements that lie apart, rows the reduction would cut into
//! chunks) are left, and a malformed pass is the same error as on the CPU.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::fused::ExprStep;
use kiln_tensor::rows::{RowPass, RowPhase, RowRead, RowTarget};
use kiln_tensor::testing::rows::{layer_norm, map};
use kiln_tensor::{
    Backend, BinaryOp, DType, Dims, Layout, Op, RawTensor, ReduceOp, Result, TensorMeta, UnaryOp,
    View,
};

/// The checks below for one backend, as tests named after it.
macro_rules! row_pass_tests {
    ($module:ident, $B:ty, $device:expr, $half:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn passes_give_the_bits_of_their_kernels_run_apart() -> Result<()> {
                super::passes_give_the_bits_of_their_kernels_run_apart::<$B>(&$device)
            }
            #[test]
            fn malformed_passes_are_the_cpus_errors() -> Result<()> {
                super::malformed_passes_are_the_cpus_errors::<$B>(&$device)
            }
            #[test]
            fn half_edges_round_as_their_kernels_apart() -> Result<()> {
                super::half_edges_round_as_their_kernels_apart::<$B>(&$device, $half)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
row_pass_tests!(
    wgpu,
    kiln_cubecl::Wgpu,
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the row-pass tests: {e}")),
    // WGSL has no bf16; lavapipe has f16 from Mesa 23 on (scripts/test.sh installs it).
    DType::F16
);
#[cfg(feature = "cuda")]
row_pass_tests!(
    cuda,
    kiln_cubecl::Cuda,
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the row-pass tests: {e}")),
    DType::BF16
);

fn row_value(k: usize) -> RowRead {
    RowRead::Output { k, broadcast: true }
}

/// A softmax of `x`: outputs the maxima, the sums of exponentials and the result.
fn softmax(rows: usize, width: usize) -> RowPass {
    use ExprStep::*;
    let shifted_exp = vec![
        Input(0),
        Input(1),
        Binary(BinaryOp::Sub, 0, 1),
        Unary(UnaryOp::Exp, 2),
    ];
    let mut normalised = shifted_exp.clone();
    normalised.extend([Input(2), Binary(BinaryOp::Div, 3, 4)]);
    RowPass {
        rows,
        width,
        phases: vec![
            RowPhase::Reduce {
                op: ReduceOp::Max,
                input: RowRead::Input(0),
                out: 0,
            },
            map(
                shifted_exp,
                vec![RowRead::Input(0), row_value(0)],
                RowTarget::Scratch,
                false,
            ),
            RowPhase::Reduce {
                op: ReduceOp::Sum,
                input: RowRead::Scratch,
                out: 1,
            },
            map(
                normalised,
                vec![RowRead::Input(0), row_value(0), row_value(1)],
                RowTarget::Output(2),
                false,
            ),
        ],
        whole_rows: vec![false, false, true],
    }
}

/// Inputs `x`, `g` (whole rows), `s` (one per row) and `s` again broadcast across
/// the rows (a phase over whole rows reads inputs of whole rows): `p = g · x` (whole
/// rows), its row sums scaled by `s` in place, the rows' minima of `g`, and
/// `x · s − sum + g`.
fn gradient_like(rows: usize, width: usize) -> RowPass {
    use ExprStep::*;
    RowPass {
        rows,
        width,
        phases: vec![
            map(
                vec![Input(0), Input(1), Binary(BinaryOp::Mul, 0, 1)],
                vec![RowRead::Input(1), RowRead::Input(0)],
                RowTarget::Output(0),
                false,
            ),
            RowPhase::Reduce {
                op: ReduceOp::Sum,
                input: RowRead::Output {
                    k: 0,
                    broadcast: false,
                },
                out: 1,
            },
            map(
                vec![Output(0), Input(0), Binary(BinaryOp::Mul, 0, 1)],
                vec![RowRead::Input(2)],
                RowTarget::Output(1),
                true,
            ),
            RowPhase::Reduce {
                op: ReduceOp::Min,
                input: RowRead::Input(1),
                out: 2,
            },
            map(
                vec![
                    Input(0),
                    Input(1),
                    Input(2),
                    Input(3),
                    Binary(BinaryOp::Mul, 0, 1),
                    Binary(BinaryOp::Sub, 4, 2),
                    Binary(BinaryOp::Add, 5, 3),
                ],
                vec![
                    RowRead::Input(0),
                    RowRead::Input(3),
                    row_value(1),
                    RowRead::Input(1),
                ],
                RowTarget::Output(3),
                false,
            ),
        ],
        whole_rows: vec![true, false, false, true],
    }
}

/// How the rows of the pass's first input (`x`) lie in its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rows {
    Contiguous,
    /// Rows 1.. of a buffer with one more row.
    Offset,
    /// Every other row of a buffer twice as tall.
    Apart,
    /// `[2, rows / 2, width]`, contiguous: two lead dims that coalesce.
    TwoLeads,
    /// `[2, rows / 2, width]` with its lead dims swapped in memory: row starts that are
    /// not evenly apart.
    SwappedLeads,
    /// The transpose of a `[width, rows]` buffer: a row's elements lie apart.
    Transposed,
}

/// One input: its buffer, its layout as the pass reads it (the pass's lead dims) and
/// as two dims `[rows, its width]` for the kernels run apart.
struct Input {
    buffer: Vec<f32>,
    pass: Layout,
    flat: Layout,
    dtype: DType,
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

fn layout(dims: &[usize], strides: &[usize], offset: usize) -> Layout {
    Layout::from_parts(Dims::new(dims).expect("dims"), strides, offset)
}

/// The pass's lead dims for `rows` rows laid out as `kind`.
fn leads(kind: Rows, rows: usize) -> Vec<usize> {
    match kind {
        Rows::TwoLeads | Rows::SwappedLeads => vec![2, rows / 2],
        _ => vec![rows],
    }
}

/// `x` laid out as `kind` over `rows` rows of `width`.
fn x_input(kind: Rows, rows: usize, width: usize, seed: u64) -> Input {
    let (r, w) = (rows, width);
    let (buffer_len, pass, flat) = match kind {
        Rows::Contiguous => (
            r * w,
            layout(&[r, w], &[w, 1], 0),
            layout(&[r, w], &[w, 1], 0),
        ),
        Rows::Offset => (
            (r + 1) * w,
            layout(&[r, w], &[w, 1], w),
            layout(&[r, w], &[w, 1], w),
        ),
        Rows::Apart => (
            2 * r * w,
            layout(&[r, w], &[2 * w, 1], 0),
            layout(&[r, w], &[2 * w, 1], 0),
        ),
        Rows::TwoLeads => (
            r * w,
            layout(&[2, r / 2, w], &[r / 2 * w, w, 1], 0),
            layout(&[r, w], &[w, 1], 0),
        ),
        Rows::SwappedLeads => (
            r * w,
            layout(&[2, r / 2, w], &[w, 2 * w, 1], 0),
            // Not one stride per row: only the pass reads it (the kernel leaves it).
            layout(&[r, w], &[w, 1], 0),
        ),
        Rows::Transposed => (
            r * w,
            layout(&[r, w], &[1, r], 0),
            layout(&[r, w], &[1, r], 0),
        ),
    };
    Input {
        buffer: values(buffer_len, seed),
        pass,
        flat,
        dtype: DType::F32,
    }
}

/// A contiguous input of `w` values per row under the lead dims of `kind`.
fn plain_input(kind: Rows, rows: usize, w: usize, seed: u64) -> Input {
    let lead = leads(kind, rows);
    let mut dims = lead.clone();
    dims.push(w);
    let pass = Layout::contiguous(Dims::new(&dims).expect("dims"));
    Input {
        buffer: values(rows * w, seed),
        pass,
        flat: layout(&[rows, w], &[w, 1], 0),
        dtype: DType::F32,
    }
}

/// `one` (a value per row, as [`plain_input`] lays it out) broadcast across each row.
fn across_rows(kind: Rows, rows: usize, width: usize, one: &Input) -> Input {
    let lead = leads(kind, rows);
    let mut dims = lead.clone();
    dims.push(width);
    let mut strides: Vec<usize> = one.pass.strides()[..lead.len()].to_vec();
    strides.push(0);
    Input {
        buffer: one.buffer.clone(),
        pass: layout(&dims, &strides, 0),
        flat: layout(&[rows, width], &[1, 0], 0),
        dtype: DType::F32,
    }
}

/// One row of `width` weights broadcast down every row.
fn broadcast_input(kind: Rows, rows: usize, width: usize, seed: u64) -> Input {
    let lead = leads(kind, rows);
    let mut dims = lead.clone();
    dims.push(width);
    let mut strides = vec![0; lead.len()];
    strides.push(1);
    Input {
        buffer: values(width, seed),
        pass: layout(&dims, &strides, 0),
        flat: layout(&[rows, width], &[0, 1], 0),
        dtype: DType::F32,
    }
}

/// Runs `pass` on backend `B` as one pass (`None` where the backend leaves it to its
/// kernels) and returns its outputs.
fn run_pass<B: Backend>(
    dev: &B::Device,
    pass: &RowPass,
    inputs: &[Input],
    halves: &[usize],
    half: DType,
) -> Result<Option<Vec<Vec<f32>>>> {
    let buffers = upload::<B>(dev, inputs)?;
    let views: Vec<View<'_, B>> = (buffers.iter().zip(inputs))
        .map(|(t, i)| View {
            storage: &**t.storage(),
            layout: i.pass,
        })
        .collect();
    let mut outs = outputs::<B>(dev, pass, halves, half)?;
    let mut refs: Vec<&mut B::Storage> = outs
        .iter_mut()
        .map(|t| t.storage_mut().expect("a fresh tensor owns its buffer"))
        .collect();
    if !B::fused_rows(dev, pass, &views, &mut refs)? {
        return Ok(None);
    }
    outs.iter().map(values_of).collect::<Result<_>>().map(Some)
}

fn upload<B: Backend>(dev: &B::Device, inputs: &[Input]) -> Result<Vec<RawTensor<B>>> {
    (inputs.iter())
        .map(|i| {
            let (v, n) = (&i.buffer, &[i.buffer.len()]);
            match i.dtype {
                DType::BF16 => RawTensor::<B>::from_vec(
                    v.iter().map(|&x| half::bf16::from_f32(x)).collect(),
                    n,
                    dev,
                ),
                DType::F16 => RawTensor::<B>::from_vec(
                    v.iter().map(|&x| half::f16::from_f32(x)).collect(),
                    n,
                    dev,
                ),
                _ => RawTensor::<B>::from_vec(v.clone(), n, dev),
            }
        })
        .collect()
}

/// The pass's outputs, zeroed: f32, or `half` for those `halves` names.
fn outputs<B: Backend>(
    dev: &B::Device,
    pass: &RowPass,
    halves: &[usize],
    half: DType,
) -> Result<Vec<RawTensor<B>>> {
    (pass.whole_rows.iter().enumerate())
        .map(|(k, &whole)| {
            let n = pass.rows * if whole { pass.width } else { 1 };
            let dtype = if halves.contains(&k) {
                half
            } else {
                DType::F32
            };
            RawTensor::<B>::zeros(&[n], dtype, dev)
        })
        .collect()
}

fn values_of<B: Backend>(t: &RawTensor<B>) -> Result<Vec<f32>> {
    Ok(t.to_f64_vec()?.into_iter().map(|v| v as f32).collect())
}

/// Runs `pass`'s phases on backend `B` one kernel at a time, as a plan runs them when
/// the backend does not run the pass: fused expressions over `[rows, width]` (or
/// `[rows, 1]`), reductions of the last axis.
fn run_apart<B: Backend>(
    dev: &B::Device,
    pass: &RowPass,
    inputs: &[Input],
    halves: &[usize],
    half: DType,
) -> Result<Vec<Vec<f32>>> {
    let (rows, width) = (pass.rows, pass.width);
    let buffers = upload::<B>(dev, inputs)?;
    let mut outs: Vec<Option<RawTensor<B>>> = outputs::<B>(dev, pass, halves, half)?
        .into_iter()
        .map(Some)
        .collect();
    let mut scratch = Some(RawTensor::<B>::zeros(&[rows * width], DType::F32, dev)?);
    let whole = layout(&[rows, width], &[width, 1], 0);
    for phase in &pass.phases {
        // Where operand `r` lies over the phase's `[rows, w]`.
        let place = |r: &RowRead, w: usize| -> (usize, Layout) {
            match *r {
                RowRead::Input(k) => {
                    let flat = inputs[k].flat;
                    let l = if flat.dims()[1] == w {
                        flat
                    } else {
                        layout(&[rows, w], &[flat.strides()[0], 0], flat.offset())
                    };
                    (k, l)
                }
                RowRead::Output { k, broadcast: true } => (k, layout(&[rows, w], &[1, 0], 0)),
                RowRead::Output { k, .. } => (k, layout(&[rows, w], &[w, 1], 0)),
                RowRead::Scratch => (0, whole),
            }
        };
        match phase {
            RowPhase::Map {
                expr,
                inputs: reads,
                target,
                per_row,
                ..
            } => {
                let w = if *per_row { 1 } else { width };
                let mut target_tensor = match *target {
                    RowTarget::Output(k) => outs[k].take().expect("an output"),
                    RowTarget::Scratch => scratch.take().expect("the scratch rows"),
                };
                {
                    let views: Vec<View<'_, B>> = reads
                        .iter()
                        .map(|r| {
                            let (k, l) = place(r, w);
                            let storage = match r {
                                RowRead::Input(_) => &**buffers[k].storage(),
                                RowRead::Output { .. } => {
                                    &**outs[k].as_ref().expect("written").storage()
                                }
                                RowRead::Scratch => &**scratch.as_ref().expect("scratch").storage(),
                            };
                            View { storage, layout: l }
                        })
                        .collect();
                    let dims = Dims::new(&[rows, w])?;
                    let out = target_tensor.storage_mut().expect("owned");
                    B::fused_elementwise(dev, expr, None, &views, &dims, &mut [out])?;
                }
                match *target {
                    RowTarget::Output(k) => outs[k] = Some(target_tensor),
                    RowTarget::Scratch => scratch = Some(target_tensor),
                }
            }
            RowPhase::Reduce { op, input, out } => {
                let (k, l) = place(input, width);
                let storage = match input {
                    RowRead::Input(_) => &**buffers[k].storage(),
                    RowRead::Output { .. } => &**outs[k].as_ref().expect("written").storage(),
                    RowRead::Scratch => &**scratch.as_ref().expect("scratch").storage(),
                };
                let reduce = Op::Reduce {
                    op: *op,
                    axes: vec![1],
                };
                let meta = TensorMeta::new(vec![rows, 1], DType::F32);
                let result = B::execute(dev, &reduce, &[View { storage, layout: l }], &meta)?;
                outs[*out] = Some(RawTensor::from_storage(
                    result,
                    Dims::new(&[rows])?,
                    dev.clone(),
                )?);
            }
        }
    }
    outs.into_iter()
        .map(|t| values_of(&t.expect("every output written")))
        .collect()
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn close(a: f32, b: f32) -> bool {
    same_bits(a, b) || (a - b).abs() <= 2e-4 * (1.0 + b.abs())
}

/// Every pass over every layout and a range of widths: run as one launch where the
/// kernel takes it, the bits of its kernels run apart, and the CPU's values.
fn passes_give_the_bits_of_their_kernels_run_apart<G: Backend>(dev: &G::Device) -> Result<()> {
    let kinds = [
        Rows::Contiguous,
        Rows::Offset,
        Rows::Apart,
        Rows::TwoLeads,
        Rows::SwappedLeads,
        Rows::Transposed,
    ];
    let shapes = [
        (1, 2),
        (6, 3),
        (64, 33),
        (10, 64),
        (300, 100),
        (34, 512),
        (8, 1000),
        (2, 4100),
        (2, 20000),
    ];
    let mut ran = 0;
    for (case, &(rows, width)) in shapes.iter().enumerate() {
        for (j, &kind) in kinds.iter().enumerate() {
            if matches!(kind, Rows::TwoLeads | Rows::SwappedLeads) && rows % 2 == 1 {
                continue;
            }
            let seed = (case * 16 + j) as u64;
            let x = || x_input(kind, rows, width, seed);
            let passes: [(&str, RowPass, Vec<Input>); 3] = [
                (
                    "layer norm",
                    layer_norm(rows, width),
                    vec![x(), broadcast_input(kind, rows, width, seed + 1)],
                ),
                ("softmax", softmax(rows, width), vec![x()]),
                ("gradient-like", gradient_like(rows, width), {
                    let s = plain_input(kind, rows, 1, seed + 3);
                    let across = across_rows(kind, rows, width, &s);
                    vec![x(), plain_input(kind, rows, width, seed + 2), s, across]
                }),
            ];
            for (name, pass, inputs) in passes {
                let what = format!("{name} over {rows} rows of {width} ({kind:?})");
                let reduces_x = name != "gradient-like";
                let expected = width < 16384
                    && !(kind == Rows::SwappedLeads && rows > 2)
                    && !(kind == Rows::Transposed && reduces_x && rows > 1);
                let cpu = run_pass::<Cpu>(&CpuDevice, &pass, &inputs, &[], DType::F32)?
                    .expect("the CPU runs passes");
                let Some(gpu) = run_pass::<G>(dev, &pass, &inputs, &[], DType::F32)? else {
                    assert!(!expected, "{what}: left to its kernels");
                    continue;
                };
                assert!(
                    expected,
                    "{what}: ran as one launch where its kernels run apart"
                );
                ran += 1;
                let apart = run_apart::<G>(dev, &pass, &inputs, &[], DType::F32)?;
                for (k, ((g, a), c)) in gpu.iter().zip(&apart).zip(&cpu).enumerate() {
                    for (i, ((&g, &a), &c)) in g.iter().zip(a).zip(c).enumerate() {
                        assert!(
                            same_bits(g, a),
                            "{what}: output {k}[{i}] {g:e} as a pass, {a:e} apart"
                        );
                        assert!(close(g, c), "{what}: output {k}[{i}] {g:e}, the CPU {c:e}");
                    }
                }
            }
        }
    }
    assert!(ran > 60, "only {ran} passes ran as one launch");
    Ok(())
}

/// A pass that reads what no phase wrote, or writes a reduction into whole rows, is
/// the CPU's error, and an input that is not rows of the pass's width is refused.
fn malformed_passes_are_the_cpus_errors<G: Backend>(dev: &G::Device) -> Result<()> {
    let (rows, width) = (4, 8);
    let inputs = || {
        vec![
            x_input(Rows::Contiguous, rows, width, 1),
            broadcast_input(Rows::Contiguous, rows, width, 2),
        ]
    };
    let mut unread = layer_norm(rows, width);
    unread.phases.drain(..2);
    let mut into_rows = layer_norm(rows, width);
    into_rows.whole_rows[0] = true;
    let mut narrow = layer_norm(rows, width);
    narrow.width = width + 1;
    for (name, pass) in [
        ("unwritten read", unread),
        ("reduction into rows", into_rows),
        ("wrong width", narrow),
    ] {
        let cpu = run_pass::<Cpu>(&CpuDevice, &pass, &inputs(), &[], DType::F32)
            .expect_err(name)
            .to_string();
        let gpu = run_pass::<G>(dev, &pass, &inputs(), &[], DType::F32)
            .expect_err(name)
            .to_string();
        assert_eq!(gpu, cpu, "{name}");
    }
    Ok(())
}

/// A layer norm as a plan under mixed precision writes it: `x` in `half`, widened by
/// the scratch expressions its sums read, and the result rounded to `half`; inputs `x`
/// and `w` (f32), outputs the means, the sums of squared deviations and the result.
fn half_layer_norm(rows: usize, width: usize) -> RowPass {
    use ExprStep::*;
    let mut pass = layer_norm(rows, width);
    pass.phases.insert(
        0,
        map(
            vec![Input(0)],
            vec![RowRead::Input(0)],
            RowTarget::Scratch,
            false,
        ),
    );
    pass.phases[1] = RowPhase::Reduce {
        op: ReduceOp::Sum,
        input: RowRead::Scratch,
        out: 0,
    };
    pass
}

/// Half inputs are widened where they are read and half outputs rounded once where
/// they are stored, as the mixed-precision kernels run apart do, bit for bit; the
/// CPU's pass within the half float's rounding.
fn half_edges_round_as_their_kernels_apart<G: Backend>(dev: &G::Device, half: DType) -> Result<()> {
    for (rows, width) in [(5, 3), (64, 100), (34, 512), (4, 1000)] {
        let mut x = x_input(Rows::Contiguous, rows, width, 7);
        x.dtype = half;
        let inputs = vec![x, broadcast_input(Rows::Contiguous, rows, width, 8)];
        let pass = half_layer_norm(rows, width);
        let what = format!("{half:?} layer norm over {rows} rows of {width}");
        let gpu = run_pass::<G>(dev, &pass, &inputs, &[2], half)?
            .unwrap_or_else(|| panic!("{what}: left to its kernels"));
        let apart = run_apart::<G>(dev, &pass, &inputs, &[2], half)?;
        let cpu =
            run_pass::<Cpu>(&CpuDevice, &pass, &inputs, &[2], half)?.expect("the CPU runs passes");
        for (k, ((g, a), c)) in gpu.iter().zip(&apart).zip(&cpu).enumerate() {
            for (i, ((&g, &a), &c)) in g.iter().zip(a).zip(c).enumerate() {
                assert!(
                    same_bits(g, a),
                    "{what}: output {k}[{i}] {g:e} as a pass, {a:e} apart"
                );
                let near = (g - c).abs() <= 1e-2 * (1.0 + c.abs());
                assert!(near, "{what}: output {k}[{i}] {g:e}, the CPU {c:e}");
            }
        }
    }
    Ok(())
}
