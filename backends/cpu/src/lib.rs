//! # kiln-cpu
//!
//! Kiln's pure-Rust CPU backend: one `Vec` per buffer, kernels generic over dtypes
//! (f16 and bf16 compute in f32), threads through `rayon`, matrix products through the
//! packed GEMM of [`gemm`]. Each concern has its module: `elementwise`, `reduce`,
//! `movement`, `index`, `window` (unfold/fold), `conv` (convolution products whose
//! columns are never stored), `source` (constants, random numbers), `matmul`; `spin`
//! keeps a few threads awake between the short parallel products of batch-1 inference.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod fused;
pub mod gemm;
pub mod index;
pub mod instances;
pub mod math;
pub mod matmul;
pub mod movement;
pub mod quant;
pub mod reduce;
pub mod rows;
pub mod source;
pub mod spin;
pub mod storage;
pub mod strided;
pub mod window;

pub use storage::CpuStorage;

use kiln_tensor::fused::ProductEpilogue;
use kiln_tensor::{
    Backend, DType, Dims, Error, FoldInto, HostData, Layout, Op, ProductOperand, Result,
    TensorMeta, View,
};

/// The first `meta`-many elements of an f32 buffer a planned step reuses, or `None`
/// where it is no f32 buffer or too short.
fn f32_result<'a>(out: &'a mut CpuStorage, meta: &TensorMeta) -> Option<&'a mut [f32]> {
    let numel: usize = meta.dims.iter().product();
    match out {
        CpuStorage::F32(o) if o.len() >= numel => Some(&mut o[..numel]),
        _ => None,
    }
}

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

/// The CPU (there is one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDevice;

impl Backend for Cpu {
    type Device = CpuDevice;
    type Storage = CpuStorage;

    const NAME: &'static str = "cpu";

    fn device_name(_: &CpuDevice) -> String {
        "cpu".into()
    }

    fn storage_dtype(s: &CpuStorage) -> DType {
        s.dtype()
    }

    fn storage_len(s: &CpuStorage) -> usize {
        s.len()
    }

    fn upload(_: &CpuDevice, data: HostData) -> Result<CpuStorage> {
        Ok(CpuStorage::from_host(data))
    }

    fn upload_static(_: &CpuDevice, bytes: &'static [u8], dtype: DType) -> Option<CpuStorage> {
        CpuStorage::from_static_bytes(bytes, dtype)
    }

    fn download(s: &CpuStorage, layout: &Layout) -> Result<HostData> {
        check_extent(s, layout)?;
        Ok(movement::contiguous(s, layout).into_host())
    }

    fn contiguous(_: &CpuDevice, x: View<'_, Cpu>) -> Result<CpuStorage> {
        check_extent(x.storage, &x.layout)?;
        Ok(movement::contiguous(x.storage, &x.layout))
    }

    fn synchronize(_: &CpuDevice) -> Result<()> {
        Ok(())
    }

    fn alloc(_: &CpuDevice, dtype: DType, len: usize) -> Result<CpuStorage> {
        Ok(source::full(len, 0.0, dtype))
    }

    fn execute_into(
        device: &CpuDevice,
        op: &Op,
        inputs: &[View<'_, Cpu>],
        meta: &TensorMeta,
        out: &mut CpuStorage,
    ) -> Result<()> {
        let numel: usize = meta.dims.iter().product();
        match (op, &mut *out) {
            (Op::Reduce { op: r, axes }, CpuStorage::F32(o)) if o.len() >= numel => {
                let x = &inputs[0];
                check_extent(x.storage, &x.layout)?;
                if reduce::reduce_f32_into(*r, x.storage, &x.layout, axes, o) {
                    return Ok(());
                }
            }
            (Op::Gather { axis: 1 }, CpuStorage::F32(o))
                if o.len() >= numel && inputs[0].layout.rank() == 2 =>
            {
                let (x, i) = (&inputs[0], &inputs[1]);
                check_extent(x.storage, &x.layout)?;
                check_extent(i.storage, &i.layout)?;
                let n = x.layout.dims()[1];
                if index::pick_rows_f32_into(
                    x.storage, &x.layout, i.storage, &i.layout, n, false, o,
                )? {
                    return Ok(());
                }
            }
            (Op::Gather { axis: 0 }, CpuStorage::F32(o))
                if o.len() >= numel && inputs[0].layout.rank() == 2 =>
            {
                let (x, i) = (&inputs[0], &inputs[1]);
                check_extent(x.storage, &x.layout)?;
                check_extent(i.storage, &i.layout)?;
                let bound = x.layout.dims()[0];
                if index::embedding_rows_f32_into(
                    x.storage, &x.layout, i.storage, &i.layout, bound, false, o,
                )? {
                    return Ok(());
                }
            }
            (Op::ScatterAdd { axis: 0, dims }, CpuStorage::F32(o))
                if o.len() >= numel && dims.len() == 2 =>
            {
                let (i, src) = (&inputs[0], &inputs[1]);
                check_extent(i.storage, &i.layout)?;
                check_extent(src.storage, &src.layout)?;
                if index::embedding_rows_f32_into(
                    src.storage,
                    &src.layout,
                    i.storage,
                    &i.layout,
                    dims[0],
                    true,
                    o,
                )? {
                    return Ok(());
                }
            }
            (Op::ScatterAdd { axis: 1, dims }, CpuStorage::F32(o))
                if o.len() >= numel && dims.len() == 2 =>
            {
                let (i, src) = (&inputs[0], &inputs[1]);
                check_extent(i.storage, &i.layout)?;
                check_extent(src.storage, &src.layout)?;
                if index::pick_rows_f32_into(
                    src.storage,
                    &src.layout,
                    i.storage,
                    &i.layout,
                    dims[1],
                    true,
                    o,
                )? {
                    return Ok(());
                }
            }
            (
                Op::Full {
                    value,
                    dtype: DType::F32,
                    ..
                },
                CpuStorage::F32(o),
            ) if o.len() >= numel => {
                o[..numel].fill(*value as f32);
                return Ok(());
            }
            (
                Op::Full {
                    value,
                    dtype: DType::I32,
                    ..
                },
                CpuStorage::I32(o),
            ) if o.len() >= numel => {
                o[..numel].fill(<i32 as kiln_tensor::Element>::from_f64(*value));
                return Ok(());
            }
            // Positions (from `iota`) to f32, as the causal mask and position tables use them.
            (Op::Cast { dtype: DType::F32 }, CpuStorage::F32(o))
                if o.len() >= numel && inputs[0].layout.is_contiguous() =>
            {
                if let CpuStorage::I32(x) = inputs[0].storage {
                    let start = inputs[0].layout.offset();
                    let Some(x) = x.get(start..start + numel) else {
                        return Err(Error::invalid(
                            "cast",
                            "the input does not cover its layout",
                        ));
                    };
                    for (o, &v) in o[..numel].iter_mut().zip(x) {
                        *o = v as f32;
                    }
                    return Ok(());
                }
            }
            (Op::Compare(c), CpuStorage::Bool(o)) if o.len() >= numel && inputs.len() == 2 => {
                let (a, b) = (&inputs[0], &inputs[1]);
                check_extent(a.storage, &a.layout)?;
                check_extent(b.storage, &b.layout)?;
                let dims = Dims::new(&meta.dims)?;
                let (a, b) = ((a.storage, &a.layout), (b.storage, &b.layout));
                if elementwise::compare_f32_into(*c, &dims, a, b, &mut o[..numel]) {
                    return Ok(());
                }
            }
            (Op::Where, CpuStorage::F32(o)) if o.len() >= numel && inputs.len() == 3 => {
                for v in inputs {
                    check_extent(v.storage, &v.layout)?;
                }
                let dims = Dims::new(&meta.dims)?;
                let x = |i: usize| (inputs[i].storage, &inputs[i].layout);
                if elementwise::select_f32_into(&dims, x(0), x(1), x(2), &mut o[..numel]) {
                    return Ok(());
                }
            }
            (Op::Unfold2d(w), CpuStorage::F32(o)) if o.len() >= numel => {
                let x = &inputs[0];
                check_extent(x.storage, &x.layout)?;
                if window::unfold2d_f32_into(x.storage, &x.layout, w, o)? {
                    return Ok(());
                }
            }
            (
                Op::Fold2d {
                    window: w,
                    height,
                    width,
                },
                CpuStorage::F32(o),
            ) if o.len() >= numel => {
                let x = &inputs[0];
                check_extent(x.storage, &x.layout)?;
                if window::fold2d_f32_into(x.storage, &x.layout, w, *height, *width, o)? {
                    return Ok(());
                }
            }
            (Op::Iota { axis, .. }, CpuStorage::I32(o)) if o.len() >= numel => {
                source::iota_into(meta.dims.as_slice(), *axis, o);
                return Ok(());
            }
            (
                Op::Rand {
                    dist,
                    seed,
                    dtype: DType::F32,
                    ..
                },
                CpuStorage::F32(o),
            ) if o.len() >= numel => {
                return source::rand_f32_into(numel, *dist, *seed, o);
            }
            _ => {}
        }
        if let (Op::MatMul, CpuStorage::F32(c)) = (op, &mut *out) {
            for v in inputs {
                check_extent(v.storage, &v.layout)?;
            }
            if c.len() >= numel {
                let (a, b) = (&inputs[0], &inputs[1]);
                if matmul::matmul_f32_into(a.storage, &a.layout, b.storage, &b.layout, c) {
                    return Ok(());
                }
            }
        }
        if let (Op::MatMul, CpuStorage::BF16(c)) = (op, &mut *out) {
            for v in inputs {
                check_extent(v.storage, &v.layout)?;
            }
            if c.len() >= numel {
                let (a, b) = (&inputs[0], &inputs[1]);
                if matmul::matmul_bf16_into(a.storage, &a.layout, b.storage, &b.layout, c) {
                    return Ok(());
                }
            }
        }
        if let (
            Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. },
            CpuStorage::F32(o),
        ) = (op, &mut *out)
        {
            if o.len() >= numel {
                for v in inputs {
                    check_extent(v.storage, &v.layout)?;
                }
                if attention::attention_f32_into(op, inputs, o)? {
                    return Ok(());
                }
            }
        }
        if matches!(
            op,
            Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. }
        ) && inputs
            .first()
            .is_some_and(|v| v.storage.dtype() == DType::BF16)
        {
            for v in inputs {
                check_extent(v.storage, &v.layout)?;
            }
            if attention::attention_bf16_into(&[op], inputs, &mut [&mut *out])? {
                return Ok(());
            }
        }
        *out = Self::execute(device, op, inputs, meta)?;
        Ok(())
    }

    fn execute_one_pass_into(
        device: &CpuDevice,
        ops: &[&Op],
        inputs: &[View<'_, Cpu>],
        metas: &[&TensorMeta],
        outs: &mut [&mut CpuStorage],
    ) -> Result<()> {
        if ops.len() <= 3 && outs.len() == ops.len() {
            let mut slices: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
            let mut f32_outs = 0;
            for ((out, meta), slice) in outs.iter_mut().zip(metas).zip(&mut slices) {
                match &mut **out {
                    CpuStorage::F32(o) if o.len() >= meta.dims.iter().product::<usize>() => {
                        *slice = &mut o[..];
                        f32_outs += 1;
                    }
                    _ => break,
                }
            }
            if f32_outs == ops.len() {
                for v in inputs {
                    check_extent(v.storage, &v.layout)?;
                }
                let slices = &mut slices[..f32_outs];
                if attention::attention_group_f32_into(ops, inputs, slices)? {
                    return Ok(());
                }
            }
        }
        if inputs
            .first()
            .is_some_and(|v| v.storage.dtype() == DType::BF16)
        {
            for v in inputs {
                check_extent(v.storage, &v.layout)?;
            }
            if attention::attention_bf16_into(ops, inputs, outs)? {
                return Ok(());
            }
        }
        kiln_tensor::backend::one_pass_by_ops::<Cpu>(device, ops, inputs, metas, outs)
    }

    fn fused_rows(
        _: &CpuDevice,
        pass: &kiln_tensor::rows::RowPass,
        inputs: &[View<'_, Cpu>],
        outputs: &mut [&mut CpuStorage],
    ) -> Result<bool> {
        rows::fused_rows(pass, inputs, outputs)
    }

    fn windowed_product_into(
        _: &CpuDevice,
        op: &Op,
        lhs: ProductOperand<'_, Cpu>,
        rhs: ProductOperand<'_, Cpu>,
        meta: &TensorMeta,
        out: &mut CpuStorage,
    ) -> Result<bool> {
        // A convolution's products read their columns as the right operand.
        let (Op::MatMul, ProductOperand::Stored(a), ProductOperand::Window(w)) = (op, lhs, rhs)
        else {
            return Ok(false);
        };
        let Some(o) = f32_result(out, meta) else {
            return Ok(false);
        };
        check_extent(a.storage, &a.layout)?;
        check_extent(w.image.storage, &w.image.layout)?;
        let columns = conv::Columns {
            image: (w.image.storage, &w.image.layout),
            window: &w.window,
            dims: &w.columns,
            layout: &w.layout,
        };
        let blocking = conv::Blocking::CACHE;
        conv::windowed_product_f32((a.storage, &a.layout), columns, o, blocking)
    }

    fn folded_product_into(
        _: &CpuDevice,
        op: &Op,
        operands: &[View<'_, Cpu>],
        _product: &TensorMeta,
        fold: &FoldInto,
        meta: &TensorMeta,
        out: &mut CpuStorage,
    ) -> Result<bool> {
        let (Op::MatMul, [a, b]) = (op, operands) else {
            return Ok(false);
        };
        let Some(o) = f32_result(out, meta) else {
            return Ok(false);
        };
        check_extent(a.storage, &a.layout)?;
        check_extent(b.storage, &b.layout)?;
        conv::folded_product_f32(
            (a.storage, &a.layout),
            (b.storage, &b.layout),
            &fold.columns,
            &fold.window,
            [fold.height, fold.width],
            o,
            conv::Blocking::CACHE,
        )
    }

    fn product_with_epilogue(
        _: &CpuDevice,
        op: &Op,
        operands: &[View<'_, Cpu>],
        out: &TensorMeta,
        epilogue: &kiln_tensor::fused::FusedExpr,
        inputs: &[View<'_, Cpu>],
    ) -> Result<Option<CpuStorage>> {
        // The int8 products add a bias row and apply an activation as they store each
        // result (float products leave their epilogue to the fused kernel after them).
        let (Op::MatMulInt8, [x, w, scale]) = (op, operands) else {
            return Ok(None);
        };
        let Some(ProductEpilogue { bias, activation }) = ProductEpilogue::of(epilogue) else {
            return Ok(None);
        };
        let bias = match bias.map(|k| inputs[k]) {
            None => None,
            Some(b) => {
                let CpuStorage::F32(values) = b.storage else {
                    return Ok(None);
                };
                if !b.layout.is_broadcast_row(&out.dims) {
                    return Ok(None);
                }
                check_extent(b.storage, &b.layout)?;
                let n = out.dims.last().copied().unwrap_or(1);
                Some(&values[b.layout.offset()..b.layout.offset() + n])
            }
        };
        for v in operands {
            check_extent(v.storage, &v.layout)?;
        }
        let (x, w, scale) = (
            (x.storage, &x.layout),
            (w.storage, &w.layout),
            (scale.storage, &scale.layout),
        );
        let product = quant::matmul_int8(x, w, scale, bias, activation)?;
        Ok(Some(product))
    }

    fn fused_elementwise(
        device: &CpuDevice,
        expr: &kiln_tensor::fused::FusedExpr,
        native: Option<kiln_tensor::fused::NativeFn>,
        inputs: &[View<'_, Cpu>],
        dims: &Dims,
        outputs: &mut [&mut CpuStorage],
    ) -> Result<()> {
        if fused::fused_elementwise(expr, native, inputs, dims, outputs)? {
            return Ok(());
        }
        kiln_tensor::backend::fused_by_ops::<Cpu>(device, expr, inputs, dims, outputs)
    }

    fn execute(
        _: &CpuDevice,
        op: &Op,
        inputs: &[View<'_, Cpu>],
        out: &TensorMeta,
    ) -> Result<CpuStorage> {
        for v in inputs {
            check_extent(v.storage, &v.layout)?;
        }
        let dims = Dims::new(&out.dims)?;
        let x = |i: usize| (inputs[i].storage, &inputs[i].layout);
        let result = match op {
            Op::Unary(u) => elementwise::unary(*u, x(0).0, x(0).1)?,
            Op::Binary(b) => elementwise::binary(*b, &dims, x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::Compare(c) => elementwise::compare(*c, &dims, x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::Where => {
                elementwise::select(&dims, x(0).0, x(0).1, x(1).0, x(1).1, x(2).0, x(2).1)?
            }
            Op::Cast { dtype } => elementwise::cast(x(0).0, x(0).1, *dtype)?,
            Op::Reduce { op, axes } => reduce::reduce(*op, x(0).0, x(0).1, axes)?,
            Op::Concat { axis } => {
                let parts: Vec<_> = (0..inputs.len()).map(x).collect();
                movement::concat(&parts, *axis, &dims)?
            }
            Op::Pad {
                axis,
                before,
                after,
                value,
            } => movement::pad(x(0).0, x(0).1, *axis, *before, *after, *value),
            Op::MatMul => matmul::matmul(x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::MatMulInt8 => quant::matmul_int8(x(0), x(1), x(2), None, None)?,
            Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. } => {
                let parts: Vec<_> = (0..inputs.len()).map(x).collect();
                attention::attention(op, &parts)?
            }
            Op::Gather { axis } => index::gather(x(0).0, x(0).1, x(1).0, x(1).1, *axis)?,
            Op::ScatterAdd { axis, .. } => {
                index::scatter_add(x(0).0, x(0).1, x(1).0, x(1).1, *axis, &dims)?
            }
            Op::Unfold2d(w) => window::unfold2d(x(0).0, x(0).1, w)?,
            Op::Fold2d {
                window,
                height,
                width,
            } => window::fold2d(x(0).0, x(0).1, window, *height, *width)?,
            Op::Full { value, dtype, .. } => source::full(dims.numel(), *value, *dtype),
            Op::Iota { axis, .. } => source::iota(dims.as_slice(), *axis),
            Op::Rand {
                dist, seed, dtype, ..
            } => source::rand(dims.numel(), *dist, *seed, *dtype)?,
            Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. } => {
                return Err(Error::invalid(
                    op.name(),
                    "views are layout changes and never reach a backend",
                ))
            }
        };
        debug_assert_eq!(
            result.len(),
            dims.numel(),
            "{} produced the wrong element count",
            op.name()
        );
        debug_assert_eq!(
            result.dtype(),
            out.dtype,
            "{} produced the wrong dtype",
            op.name()
        );
        Ok(result)
    }
}

/// A layout must stay inside its buffer: a broken view is a bug, reported as an error
/// rather than an out-of-bounds read.
fn check_extent(s: &CpuStorage, l: &Layout) -> Result<()> {
    if l.storage_extent() > s.len() {
        return Err(Error::invalid(
            "view",
            format!(
                "layout {:?} reaches past a buffer of {} elements",
                l,
                s.len()
            ),
        ));
    }
    Ok(())
}
