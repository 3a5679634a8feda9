//! The CPU's fused elementwise kernels over short rows (a permuted head's values, a
//! layer's row beside its per-row statistics), where one task runs many whole rows:
//! equal bit for bit to the same expression op by op, for row counts that do not fill
//! the last task, inputs strided, broadcast, contiguous and bool, native loop or
//! interpreter.

use kiln_cpu::{Cpu, CpuDevice, CpuStorage};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{Backend, BinaryOp, CmpOp, DType, Dims, RawTensor, Result, UnaryOp, View};

fn random(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    kiln_tensor::testing::lcg_tensor(dims, seed, &CpuDevice)
}

/// `where(a > c, exp(a) * b, -a) + c` over `[B, T, H, E]`: `a` a permuted view of
/// `[B, H, T, E]`, `b` contiguous, `c` per-row statistics `[B, T, H, 1]` broadcast.
fn expr() -> FusedExpr {
    use ExprStep::*;
    FusedExpr {
        steps: vec![
            Input(0),
            Input(1),
            Input(2),
            Compare(CmpOp::Gt, 0, 2),
            Unary(UnaryOp::Exp, 0),
            Binary(BinaryOp::Mul, 4, 1),
            Unary(UnaryOp::Neg, 0),
            Select(3, 5, 6),
            Binary(BinaryOp::Add, 7, 2),
        ],
        results: vec![8],
        inputs: 3,
    }
}

/// The same expression as a native loop, as `#[model]` would generate it.
fn native(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
    let n = outs[0].len();
    for j in 0..n {
        let (a, b, c) = (ins[0][j], ins[1][j], ins[2][j]);
        let taken = kiln_tensor::fused::compare_f32(CmpOp::Gt, a, c);
        let e = kiln_tensor::fused::unary_f32(UnaryOp::Exp, a);
        let m = kiln_tensor::fused::binary_f32(BinaryOp::Mul, e, b);
        let neg = kiln_tensor::fused::unary_f32(UnaryOp::Neg, a);
        let s = kiln_tensor::fused::select_f32(taken, m, neg);
        outs[0][j] = kiln_tensor::fused::binary_f32(BinaryOp::Add, s, c);
    }
}

fn bits(s: &CpuStorage, n: usize) -> Vec<u32> {
    match s {
        CpuStorage::F32(v) => v[..n].iter().map(|x| x.to_bits()).collect(),
        other => panic!("unexpected dtype {}", other.dtype()),
    }
}

#[test]
fn short_rows_run_many_to_a_task_and_equal_the_ops() -> Result<()> {
    // Rows of 32 and of 5 (64 and 409 to a task), over row counts that leave the last
    // task part full, and one long row cut into chunks.
    for (b, t, h, e) in [(3, 37, 4, 32), (2, 61, 3, 5), (1, 3, 1, 5000)] {
        let dims = [b, t, h, e];
        let a = random(&[b, h, t, e], 1)?.permute(&[0, 2, 1, 3])?;
        let x = random(&dims, 2)?;
        let c = random(&[b, t, h, 1], 3)?.broadcast_to(&dims)?;
        fused_equals_ops(&[a.view(), x.view(), c.view()], &dims, "f32")?;
    }
    Ok(())
}

/// [`expr`] over `views` of `dims`, through the native loop and the interpreter, equal
/// bit for bit to the expression run op by op.
fn fused_equals_ops(views: &[View<'_, Cpu>], dims: &[usize], what: &str) -> Result<()> {
    let d = Dims::new(dims)?;
    let n = d.numel();
    let mut want = Cpu::alloc(&CpuDevice, DType::F32, n)?;
    kiln_tensor::backend::fused_by_ops::<Cpu>(&CpuDevice, &expr(), views, &d, &mut [&mut want])?;
    for loop_fn in [None, Some(native as kiln_tensor::fused::NativeFn)] {
        // Longer than the result: the kernel writes its elements and no others.
        let mut got = CpuStorage::F32(vec![f32::NAN; n + 3].into());
        Cpu::fused_elementwise(&CpuDevice, &expr(), loop_fn, views, &d, &mut [&mut got])?;
        assert_eq!(
            bits(&got, n),
            bits(&want, n),
            "{what}, {dims:?}, native {}",
            loop_fn.is_some()
        );
    }
    Ok(())
}

#[test]
fn a_bool_input_over_short_rows_reads_as_ones_and_zeros() -> Result<()> {
    let dims = [7, 3, 9];
    let x = random(&dims, 4)?;
    let half = RawTensor::<Cpu>::from_vec(vec![0.0f32], &[], &CpuDevice)?.broadcast_to(&dims)?;
    // A bool mask, permuted so that its rows are strided.
    let mask = random(&[7, 9, 3], 5)?
        .compare(
            CmpOp::Ge,
            &RawTensor::<Cpu>::from_vec(vec![0.0f32], &[], &CpuDevice)?.broadcast_to(&[7, 9, 3])?,
        )?
        .permute(&[0, 2, 1])?;
    use ExprStep::*;
    let select = FusedExpr {
        steps: vec![Input(0), Input(1), Input(2), Select(0, 1, 2)],
        results: vec![3],
        inputs: 3,
    };
    let d = Dims::new(&dims)?;
    let views: [View<'_, Cpu>; 3] = [mask.view(), x.view(), half.view()];
    let n = d.numel();
    let mut want = Cpu::alloc(&CpuDevice, DType::F32, n)?;
    kiln_tensor::backend::fused_by_ops::<Cpu>(&CpuDevice, &select, &views, &d, &mut [&mut want])?;
    let mut got = CpuStorage::F32(vec![f32::NAN; n].into());
    Cpu::fused_elementwise(&CpuDevice, &select, None, &views, &d, &mut [&mut got])?;
    assert_eq!(bits(&got, n), bits(&want, n));
    Ok(())
}

#[test]
fn half_inputs_over_short_rows_widen_as_the_ops_do() -> Result<()> {
    // The expression's first two inputs as bf16 or f16: the permuted one staged row by
    // row, the contiguous one whose rows follow one another staged as one run.
    for half in [DType::BF16, DType::F16] {
        for (b, t, h, e) in [(3, 37, 4, 32), (2, 61, 3, 5), (1, 3, 1, 5000)] {
            let dims = [b, t, h, e];
            let a = random(&[b, h, t, e], 1)?
                .cast(half)?
                .permute(&[0, 2, 1, 3])?;
            let x = random(&dims, 2)?.cast(half)?;
            let c = random(&[b, t, h, 1], 3)?.broadcast_to(&dims)?;
            fused_equals_ops(&[a.view(), x.view(), c.view()], &dims, &half.to_string())?;
        }
    }
    Ok(())
}

/// A storage's elements as raw bits, whatever its float dtype.
fn raw_bits(s: &CpuStorage) -> Vec<u32> {
    match s {
        CpuStorage::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        CpuStorage::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        other => panic!("unexpected dtype {}", other.dtype()),
    }
}

#[test]
fn a_copy_moves_the_elements_of_every_float_dtype_unchanged() -> Result<()> {
    use ExprStep::*;
    let copy = FusedExpr {
        steps: vec![Input(0)],
        results: vec![0],
        inputs: 1,
    };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        // A head merge (rows of 32 apart), the same large enough to run in parallel, a
        // transpose (inner stride not 1) and a broadcast (inner stride 0).
        let merged = random(&[3, 4, 37, 32], 7)?
            .cast(dtype)?
            .permute(&[0, 2, 1, 3])?;
        let large = random(&[8, 4, 128, 32], 8)?
            .cast(dtype)?
            .permute(&[0, 2, 1, 3])?;
        let transposed = random(&[33, 70], 9)?.cast(dtype)?.permute(&[1, 0])?;
        let broadcast = random(&[5, 1], 10)?.cast(dtype)?.broadcast_to(&[5, 9])?;
        for x in [merged, large, transposed, broadcast] {
            let want = x.contiguous()?;
            let n = x.numel();
            let mut got = Cpu::alloc(&CpuDevice, dtype, n)?;
            Cpu::fused_elementwise(
                &CpuDevice,
                &copy,
                None,
                &[x.view()],
                x.dims(),
                &mut [&mut got],
            )?;
            assert_eq!(
                raw_bits(&got),
                raw_bits(want.storage()),
                "{dtype}, {:?}",
                x.layout()
            );
        }
    }
    Ok(())
}
