//! The CPU's into-paths (what a planned step writes into its reused slots) against the
//! allocating ops they stand for, bit for bit: attention's forward pass, row
//! statistics and three gradients over strided (permuted) heads, causal or not, with
//! dropout or without, alone and in the one-pass groups a plan runs them in;
//! over bf16 heads (widened once, rounded as the allocating ops round); comparisons and
//! selections, broadcast operands included. Each
//! output buffer starts full of a value the op never writes, so a value left unwritten
//! shows.

use kiln_cpu::{Cpu, CpuDevice, CpuStorage};
use kiln_tensor::{
    AttentionDropout, AttentionInput, AttentionSpec, Backend, CmpOp, DType, Dims, Op, RawTensor,
    Result, TensorMeta, View,
};

fn random(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    kiln_tensor::testing::lcg_tensor(dims, seed, &CpuDevice)
}

/// `[B, T, H, E]` permuted to `[B, H, T, E]`: a strided view, as a model's heads are.
fn heads(b: usize, t: usize, h: usize, e: usize, seed: u64) -> Result<RawTensor<Cpu>> {
    random(&[b, t, h, e], seed)?.permute(&[0, 2, 1, 3])
}

fn bits(s: &CpuStorage) -> Vec<u32> {
    match s {
        CpuStorage::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        CpuStorage::Bool(v) => v.iter().map(|&x| x as u32).collect(),
        other => panic!("unexpected dtype {}", other.dtype()),
    }
}

/// `op` through `execute` and through `execute_into` into a stale buffer of `dtype`
/// (one element longer than the result, as a reused slot may be), equal bit for bit,
/// the buffer written in place (not replaced).
fn same_both_ways(op: &Op, inputs: &[&RawTensor<Cpu>], dims: &[usize], dtype: DType) -> Result<()> {
    let views: Vec<View<'_, Cpu>> = inputs.iter().map(|t| t.view()).collect();
    let meta = TensorMeta::new(dims.to_vec(), dtype);
    let want = Cpu::execute(&CpuDevice, op, &views, &meta)?;
    let n: usize = dims.iter().product();
    let mut out = match dtype {
        DType::F32 => CpuStorage::F32(vec![f32::from_bits(0x7fc0_1234); n + 1].into()),
        DType::BF16 => CpuStorage::BF16(vec![half::bf16::from_bits(0x7fc3); n + 1].into()),
        DType::Bool => CpuStorage::Bool(vec![true; n + 1].into()),
        other => panic!("unexpected dtype {other}"),
    };
    Cpu::execute_into(&CpuDevice, op, &views, &meta, &mut out)?;
    assert_eq!(out.len(), n + 1, "{} replaced its buffer", op.name());
    assert_eq!(bits(&out)[..n], bits(&want)[..], "{}", op.name());
    Ok(())
}

/// bf16 products (batched, a transposed and a broadcast operand, a long reduction that
/// splits into parts) into their slots are the allocating products.
#[test]
fn bf16_products_into_their_slots_are_the_allocating_products() -> Result<()> {
    let half = |x: RawTensor<Cpu>| x.cast(DType::BF16);
    let a = half(random(&[3, 40, 70], 31)?)?;
    let b = half(random(&[3, 50, 70], 32)?)?.permute(&[0, 2, 1])?;
    same_both_ways(&Op::MatMul, &[&a, &b], &[3, 40, 50], DType::BF16)?;
    let w = half(random(&[70, 50], 33)?)?.broadcast_to(&[3, 70, 50])?;
    same_both_ways(&Op::MatMul, &[&a, &w], &[3, 40, 50], DType::BF16)?;
    let x = half(random(&[4096, 64], 34)?)?.permute(&[1, 0])?;
    let g = half(random(&[4096, 96], 35)?)?;
    same_both_ways(&Op::MatMul, &[&x, &g], &[64, 96], DType::BF16)
}

#[test]
fn attention_into_its_slot_is_the_allocating_op() -> Result<()> {
    let (b, t, h, e) = (2, 70, 3, 8);
    let (q, k, v) = (
        heads(b, t, h, e, 1)?,
        heads(b, t, h, e, 2)?,
        heads(b, t, h, e, 3)?,
    );
    let g = random(&[b, h, t, e], 4)?;
    for causal in [false, true] {
        for dropout in [None, Some(AttentionDropout { p: 0.25, seed: 9 })] {
            let spec = AttentionSpec {
                dropout,
                ..AttentionSpec::new(1.0 / (e as f64).sqrt(), causal)
            };
            same_both_ways(
                &Op::Attention(spec),
                &[&q, &k, &v],
                &[b, h, t, e],
                DType::F32,
            )?;
            let stats = Op::AttentionLse(spec.without_dropout());
            same_both_ways(&stats, &[&q, &k], &[b, h, t, 1], DType::F32)?;
            // The statistics the backward pass reads: the row log-sum-exp and the
            // row sums of g · out, taken from the allocating ops.
            let lse_meta = TensorMeta::new(vec![b, h, t, 1], DType::F32);
            let lse = Cpu::execute(&CpuDevice, &stats, &[q.view(), k.view()], &lse_meta)?;
            let lse = RawTensor::<Cpu>::from_storage(lse, Dims::new(&[b, h, t, 1])?, CpuDevice)?;
            let delta = random(&[b, h, t, 1], 5)?;
            for wrt in [
                AttentionInput::Query,
                AttentionInput::Key,
                AttentionInput::Value,
            ] {
                let op = Op::AttentionGrad { spec, wrt };
                same_both_ways(
                    &op,
                    &[&q, &k, &v, &g, &lse, &delta],
                    &[b, h, t, e],
                    DType::F32,
                )?;
            }
        }
    }
    Ok(())
}

/// A buffer of `n` f32 values none of the ops writes (NaN with a payload).
fn stale(n: usize) -> CpuStorage {
    CpuStorage::F32(vec![f32::from_bits(0x7fc0_1234); n + 1].into())
}

/// The ops of a one-pass group through `execute_one_pass_into`, each equal bit for bit
/// to the op run alone through `execute`.
fn one_pass_is_each_op(ops: &[&Op], inputs: &[&RawTensor<Cpu>], dims: &[&[usize]]) -> Result<()> {
    assert!(kiln_tensor::attention::one_pass(ops));
    let views: Vec<View<'_, Cpu>> = inputs.iter().map(|t| t.view()).collect();
    let metas: Vec<TensorMeta> = dims
        .iter()
        .map(|d| TensorMeta::new(d.to_vec(), DType::F32))
        .collect();
    let mut outs: Vec<CpuStorage> = dims.iter().map(|d| stale(d.iter().product())).collect();
    let mut out_refs: Vec<&mut CpuStorage> = outs.iter_mut().collect();
    let meta_refs: Vec<&TensorMeta> = metas.iter().collect();
    Cpu::execute_one_pass_into(&CpuDevice, ops, &views, &meta_refs, &mut out_refs)?;
    // The group's own pass ran (not the op-by-op fallback): called directly, it takes
    // the group and writes the same bits.
    let mut direct: Vec<Vec<f32>> = dims
        .iter()
        .map(|d| vec![f32::NAN; d.iter().product()])
        .collect();
    let mut slices: Vec<&mut [f32]> = direct.iter_mut().map(|d| &mut d[..]).collect();
    assert!(kiln_cpu::attention::attention_group_f32_into(
        ops,
        &views,
        &mut slices
    )?);
    for (d, out) in direct.iter().zip(&outs) {
        let d: Vec<u32> = d.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits(out)[..d.len()], d[..]);
    }
    for ((op, meta), out) in ops.iter().zip(&metas).zip(&outs) {
        let takes = match op.arity() {
            kiln_tensor::Arity::Exact(n) => n,
            kiln_tensor::Arity::AtLeast(_) => views.len(),
        };
        let want = Cpu::execute(&CpuDevice, op, &views[..takes], meta)?;
        let n: usize = meta.dims.iter().product();
        assert_eq!(
            bits(out)[..n],
            bits(&want)[..],
            "{} in a one-pass group",
            op.name()
        );
    }
    Ok(())
}

#[test]
fn one_pass_groups_write_what_their_ops_write_alone() -> Result<()> {
    // Query and key counts that are not multiples of the blocks.
    let (b, t, h, e) = (2, 150, 3, 8);
    let (q, k, v) = (
        heads(b, t, h, e, 11)?,
        heads(b, t, h, e, 12)?,
        heads(b, t, h, e, 13)?,
    );
    let g = random(&[b, h, t, e], 14)?;
    let delta = random(&[b, h, t, 1], 15)?;
    let (rows, stats): (&[usize], &[usize]) = (&[b, h, t, e], &[b, h, t, 1]);
    for causal in [false, true] {
        for dropout in [None, Some(AttentionDropout { p: 0.25, seed: 9 })] {
            let spec = AttentionSpec {
                dropout,
                ..AttentionSpec::new(0.3, causal)
            };
            let lse_op = Op::AttentionLse(spec.without_dropout());
            one_pass_is_each_op(
                &[&Op::Attention(spec), &lse_op],
                &[&q, &k, &v],
                &[rows, stats],
            )?;
            let lse = Cpu::execute(
                &CpuDevice,
                &lse_op,
                &[q.view(), k.view()],
                &TensorMeta::new(stats.to_vec(), DType::F32),
            )?;
            let lse = RawTensor::<Cpu>::from_storage(lse, Dims::new(stats)?, CpuDevice)?;
            let grad = |wrt| Op::AttentionGrad { spec, wrt };
            let (dq, dk, dv) = (
                grad(AttentionInput::Query),
                grad(AttentionInput::Key),
                grad(AttentionInput::Value),
            );
            let ins = [&q, &k, &v, &g, &lse, &delta];
            one_pass_is_each_op(&[&dq, &dk, &dv], &ins, &[rows, rows, rows])?;
            // Any two of them, in any order.
            one_pass_is_each_op(&[&dv, &dq], &ins, &[rows, rows])?;
            one_pass_is_each_op(&[&dk, &dv], &ins, &[rows, rows])?;
        }
    }
    Ok(())
}

#[test]
fn ops_one_pass_does_not_compute_together_are_refused_as_a_group() {
    let spec = AttentionSpec::new(0.5, true);
    let other = AttentionSpec::new(0.25, true);
    let grad = |spec, wrt| Op::AttentionGrad { spec, wrt };
    let q = AttentionInput::Query;
    let refused: [&[Op]; 5] = [
        &[Op::Attention(spec)],
        &[Op::AttentionLse(spec), Op::Attention(spec)],
        &[Op::Attention(spec), Op::AttentionLse(other)],
        &[grad(spec, q), grad(spec, q)],
        &[grad(spec, q), grad(other, AttentionInput::Key)],
    ];
    for ops in refused {
        let refs: Vec<&Op> = ops.iter().collect();
        assert!(!kiln_tensor::attention::one_pass(&refs), "{ops:?}");
    }
}

#[test]
fn comparisons_and_selections_into_their_slots_are_the_allocating_ops() -> Result<()> {
    let x = random(&[3, 40, 17], 6)?;
    let y = random(&[3, 17, 40], 7)?.permute(&[0, 2, 1])?;
    let half =
        RawTensor::<Cpu>::from_vec(vec![0.5f32], &[], &CpuDevice)?.broadcast_to(&[3, 40, 17])?;
    for op in CmpOp::ALL {
        same_both_ways(&Op::Compare(*op), &[&x, &y], &[3, 40, 17], DType::Bool)?;
        same_both_ways(&Op::Compare(*op), &[&x, &half], &[3, 40, 17], DType::Bool)?;
    }
    let mask = x.compare(CmpOp::Ge, &half)?;
    same_both_ways(&Op::Where, &[&mask, &x, &y], &[3, 40, 17], DType::F32)?;
    same_both_ways(&Op::Where, &[&mask, &x, &half], &[3, 40, 17], DType::F32)?;
    Ok(())
}

/// Unfolds and folds (padding, strides, dilation, windows wider than the image, a
/// strided input) and reductions over every pattern of axes a convolution network
/// reduces (leading, trailing, a run between kept axes, all but one run, and others
/// that stage a copy) into their slots are the allocating ops, with signed zeros and
/// NaN in the data.
#[test]
fn windows_and_reductions_into_their_slots_are_the_allocating_ops() -> Result<()> {
    use kiln_tensor::{ReduceOp, Window2d};
    let x = random(&[2, 3, 9, 7], 41)?;
    let strided = random(&[2, 9, 7, 3], 42)?.permute(&[0, 3, 1, 2])?;
    // A convolution's output as the next layer reads it: `[C, N, H, W]` seen as
    // `[N, C, H, W]`, rows contiguous (read in place).
    let channels_first = random(&[3, 2, 9, 7], 45)?.permute(&[1, 0, 2, 3])?;
    let channels_first_copy = channels_first.contiguous()?;
    let windows = [
        ([3, 3], [1, 1], [1, 1], [1, 1]),
        ([5, 5], [1, 1], [0, 0], [1, 1]),
        ([2, 2], [2, 2], [0, 0], [1, 1]),
        ([3, 2], [2, 3], [1, 0], [2, 1]),
        ([3, 3], [1, 1], [4, 4], [1, 1]),
    ];
    for (kernel, stride, padding, dilation) in windows {
        let w = Window2d {
            kernel,
            stride,
            padding,
            dilation,
        };
        let (oh, ow) = (w.out_size(0, 9)?, w.out_size(1, 7)?);
        let taps = 3 * kernel[0] * kernel[1];
        for input in [&x, &strided, &channels_first] {
            same_both_ways(&Op::Unfold2d(w), &[input], &[taps, 2, oh * ow], DType::F32)?;
        }
        let unfold = |x: &RawTensor<Cpu>| {
            x.apply(Op::Unfold2d(w), &[])
                .and_then(|c| c.to_vec::<f32>())
        };
        assert_eq!(
            unfold(&channels_first)?,
            unfold(&channels_first_copy)?,
            "unfold read through strides"
        );
        let cols = random(&[taps, 2, oh * ow], 43)?;
        let fold = Op::Fold2d {
            window: w,
            height: 9,
            width: 7,
        };
        same_both_ways(&fold, &[&cols], &[2, 3, 9, 7], DType::F32)?;
    }
    let mut values = random(&[4, 6, 5, 9], 44)?.to_vec::<f32>()?;
    values[7] = -0.0;
    values[100] = f32::NAN;
    values[301] = -0.0;
    let x = RawTensor::<Cpu>::from_vec(values, &[4, 6, 5, 9], &CpuDevice)?;
    let dims = [4usize, 6, 5, 9];
    let patterns: [&[usize]; 9] = [
        &[0],
        &[0, 1],
        &[3],
        &[2, 3],
        &[2],
        &[1, 2],
        &[0, 2, 3],
        &[0, 3],
        &[0, 1, 2, 3],
    ];
    for axes in patterns {
        let kept: Vec<usize> = (0..4)
            .filter(|a| !axes.contains(a))
            .map(|a| dims[a])
            .collect();
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let reduce = Op::Reduce {
                op,
                axes: axes.to_vec(),
            };
            same_both_ways(&reduce, &[&x], &kept, DType::F32)?;
        }
    }
    Ok(())
}

#[test]
fn embedding_lookups_and_their_gradients_into_their_slots_are_the_allocating_ops() -> Result<()> {
    let (vocab, width, rows) = (50, 16, 37);
    // Repeated ids: the scatter-add's sums take their terms in row order on both paths.
    let ids: Vec<i32> = (0..rows).map(|r| (r * 7 % 11) as i32).collect();
    let index =
        RawTensor::<Cpu>::from_vec(ids, &[rows, 1], &CpuDevice)?.broadcast_to(&[rows, width])?;
    let table = random(&[vocab, width], 8)?;
    let strided_table = random(&[width, vocab], 9)?.permute(&[1, 0])?;
    for t in [&table, &strided_table] {
        same_both_ways(
            &Op::Gather { axis: 0 },
            &[t, &index],
            &[rows, width],
            DType::F32,
        )?;
    }
    let scatter = Op::ScatterAdd {
        axis: 0,
        dims: vec![vocab, width],
    };
    let src = random(&[rows, width], 10)?;
    let strided_src = random(&[width, rows], 11)?.permute(&[1, 0])?;
    for s in [&src, &strided_src] {
        same_both_ways(&scatter, &[&index, s], &[vocab, width], DType::F32)?;
    }
    // An id past the table: the same error on both paths.
    let bad = RawTensor::<Cpu>::from_vec(vec![3i32, 50], &[2, 1], &CpuDevice)?
        .broadcast_to(&[2, width])?;
    let meta = TensorMeta::new(vec![2, width], DType::F32);
    let want = Cpu::execute(
        &CpuDevice,
        &Op::Gather { axis: 0 },
        &[table.view(), bad.view()],
        &meta,
    )
    .expect_err("out of range");
    let mut out = CpuStorage::F32(vec![0.0; 2 * width].into());
    let got = Cpu::execute_into(
        &CpuDevice,
        &Op::Gather { axis: 0 },
        &[table.view(), bad.view()],
        &meta,
        &mut out,
    )
    .expect_err("out of range");
    assert_eq!(got.to_string(), want.to_string());
    Ok(())
}

/// A buffer of `n` elements of `dtype` that no op writes (a NaN with a payload).
fn stale_of(dtype: DType, n: usize) -> CpuStorage {
    match dtype {
        DType::BF16 => CpuStorage::BF16(vec![half::bf16::from_bits(0x7fc3); n + 1].into()),
        _ => stale(n),
    }
}

/// bf16 attention (f32 statistics) through `execute_into` alone and
/// `execute_one_pass_into` in groups, each op equal bit for bit to the allocating op,
/// which widens its inputs and rounds its result the same way.
#[test]
fn bf16_attention_into_its_slots_is_the_allocating_op() -> Result<()> {
    let (b, t, h, e) = (2, 150, 3, 8);
    let half = |x: RawTensor<Cpu>| x.cast(DType::BF16);
    let (q, k, v) = (
        half(heads(b, t, h, e, 21)?)?,
        half(heads(b, t, h, e, 22)?)?,
        half(heads(b, t, h, e, 23)?)?,
    );
    let g = half(random(&[b, h, t, e], 24)?)?;
    let delta = random(&[b, h, t, 1], 25)?;
    let (rows, stats): (&[usize], &[usize]) = (&[b, h, t, e], &[b, h, t, 1]);
    let check = |ops: &[&Op], inputs: &[&RawTensor<Cpu>], outs: &[(&[usize], DType)]| {
        let views: Vec<View<'_, Cpu>> = inputs.iter().map(|t| t.view()).collect();
        let metas: Vec<TensorMeta> = outs
            .iter()
            .map(|(d, dtype)| TensorMeta::new(d.to_vec(), *dtype))
            .collect();
        let meta_refs: Vec<&TensorMeta> = metas.iter().collect();
        let mut got: Vec<CpuStorage> = outs
            .iter()
            .map(|(d, dtype)| stale_of(*dtype, d.iter().product()))
            .collect();
        let mut refs: Vec<&mut CpuStorage> = got.iter_mut().collect();
        if ops.len() == 1 {
            Cpu::execute_into(&CpuDevice, ops[0], &views, &metas[0], refs[0])?;
        } else {
            Cpu::execute_one_pass_into(&CpuDevice, ops, &views, &meta_refs, &mut refs)?;
        }
        // The bf16 pass ran (not a fallback that would have replaced the buffers).
        for ((out, meta), (_, dtype)) in got.iter().zip(&metas).zip(outs) {
            assert_eq!(out.dtype(), *dtype);
            assert_eq!(out.len(), meta.dims.iter().product::<usize>() + 1);
        }
        for ((op, meta), out) in ops.iter().zip(&metas).zip(&got) {
            let takes = match op.arity() {
                kiln_tensor::Arity::Exact(n) => n,
                kiln_tensor::Arity::AtLeast(_) => views.len(),
            };
            let want = Cpu::execute(&CpuDevice, op, &views[..takes], meta)?;
            let n: usize = meta.dims.iter().product();
            assert_eq!(bits(out)[..n], bits(&want)[..], "bf16 {}", op.name());
        }
        Ok::<(), kiln_tensor::Error>(())
    };
    for causal in [false, true] {
        for dropout in [None, Some(AttentionDropout { p: 0.25, seed: 9 })] {
            let spec = AttentionSpec {
                dropout,
                ..AttentionSpec::new(0.3, causal)
            };
            let attention = Op::Attention(spec);
            let lse_op = Op::AttentionLse(spec.without_dropout());
            check(&[&attention], &[&q, &k, &v], &[(rows, DType::BF16)])?;
            check(&[&lse_op], &[&q, &k], &[(stats, DType::F32)])?;
            check(
                &[&attention, &lse_op],
                &[&q, &k, &v],
                &[(rows, DType::BF16), (stats, DType::F32)],
            )?;
            let lse = Cpu::execute(
                &CpuDevice,
                &lse_op,
                &[q.view(), k.view()],
                &TensorMeta::new(stats.to_vec(), DType::F32),
            )?;
            let lse = RawTensor::<Cpu>::from_storage(lse, Dims::new(stats)?, CpuDevice)?;
            let grad = |wrt| Op::AttentionGrad { spec, wrt };
            let (dq, dk, dv) = (
                grad(AttentionInput::Query),
                grad(AttentionInput::Key),
                grad(AttentionInput::Value),
            );
            let ins = [&q, &k, &v, &g, &lse, &delta];
            let r = (rows, DType::BF16);
            check(&[&dk], &ins, &[r])?;
            check(&[&dq, &dk, &dv], &ins, &[r, r, r])?;
            check(&[&dv, &dq], &ins, &[r, r])?;
        }
    }
    Ok(())
}
