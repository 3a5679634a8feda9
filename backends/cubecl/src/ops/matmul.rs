//! Launching Kiln's own tiled matmul (wgpu; CUDA uses cuBLASLt instead), and which
//! product epilogues a vendor library can run inside the product.

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::matmul as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{coalesce, word, Operand, MAX_GRID};
use crate::CubeBackend;
use cubecl::prelude::*;
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// Which of Kiln's own product kernels wgpu launches: the adapter's choice, or one
/// pinned by a test or a benchmark. CUDA's products go to cuBLASLt and ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductKernel {
    /// The direct kernel on CPU drivers; elsewhere the tiled one, with K split into
    /// ranges where the output has too few tiles to fill the GPU.
    Auto,
    /// The direct kernel (no shared memory or barriers), whatever the adapter.
    Direct,
    /// The tiled kernel with K cut into at most `splits` ranges (1: unsplit; fewer when
    /// K has fewer steps), whatever the adapter.
    Tiled {
        /// The most ranges K is cut into.
        splits: u32,
    },
}

/// The pinned kernel: 0 for [`ProductKernel::Auto`], 1 for `Direct`, `2 + splits` for
/// `Tiled`.
static PRODUCT_KERNEL: AtomicU32 = AtomicU32::new(0);

/// Pins the product kernel for every wgpu device of this process (tests and
/// benchmarks compare kernels with it); [`ProductKernel::Auto`] unpins it.
pub fn set_product_kernel(kernel: ProductKernel) {
    let code = match kernel {
        ProductKernel::Auto => 0,
        ProductKernel::Direct => 1,
        ProductKernel::Tiled { splits } => splits.clamp(1, u32::MAX - 2) + 2,
    };
    PRODUCT_KERNEL.store(code, Ordering::SeqCst);
}

/// The product kernel pinned by [`set_product_kernel`] ([`ProductKernel::Auto`] if none).
pub fn product_kernel() -> ProductKernel {
    match PRODUCT_KERNEL.load(Ordering::SeqCst) {
        0 => ProductKernel::Auto,
        1 => ProductKernel::Direct,
        code => ProductKernel::Tiled { splits: code - 2 },
    }
}

/// Cubes a split product aims for: two per SM of a large GPU (132 on an H100), several
/// per compute unit of a small one.
const TARGET_CUBES: usize = 256;
/// A product with at least this many tiles is not split: its cubes already fill a GPU.
const SPLIT_BELOW: usize = 128;
/// The fewest K steps a range gets, so a cube's loads and barriers are not all
/// start-up.
const MIN_STEPS_PER_SPLIT: usize = 4;
/// The most ranges K is cut into.
const MAX_SPLITS: usize = 16;

/// How many ranges the tiled kernel cuts K into for a product of `tiles` output tiles
/// (batches included) and depth `kdim`: enough cubes to fill the GPU, each range at
/// least [`MIN_STEPS_PER_SPLIT`] deep. The partial sums are bounded with it: fewer
/// than [`SPLIT_BELOW`] tiles of 4,096 outputs, times at most `TARGET_CUBES / tiles +
/// 1` ranges, is under 384 × 4,096 values (6 MiB of f32).
fn auto_splits(tiles: usize, kdim: usize) -> u32 {
    if tiles >= SPLIT_BELOW {
        return 1;
    }
    let steps = kdim.div_ceil(k::DEPTH as usize);
    TARGET_CUBES
        .div_ceil(tiles.max(1))
        .min(steps / MIN_STEPS_PER_SPLIT)
        .clamp(1, MAX_SPLITS) as u32
}

/// The dtype a product of `dtype` accumulates in (and a split product's partial sums
/// are kept in): f32 for the half floats, as the kernels' `A`.
fn accumulator(dtype: DType) -> DType {
    if dtype.is_half() {
        DType::F32
    } else {
        dtype
    }
}

/// `[.., M, K] × [.., K, N]` with identical (broadcast) batch dims.
pub fn matmul<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    a: V<'_, R>,
    b: V<'_, R>,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let total: usize = out.dims.iter().product();
    let result = dev.alloc("matmul", out.dtype, total)?;
    let r = out.dims.len();
    let (m, n) = (out.dims[r - 2], out.dims[r - 1]);
    let kdim = a.layout.dims()[r - 1];
    if total == 0 {
        return Ok(result);
    }
    if kdim == 0 {
        super::elementwise::fill(
            dev,
            &result,
            &kiln_tensor::HostData::from_f64_slice(out.dtype, &[0.0]),
        )?;
        return Ok(result);
    }
    let batch_dims = &out.dims[..r - 2];
    let batch: usize = batch_dims.iter().product();
    let (sa, sb) = (a.layout.strides(), b.layout.strides());
    let (bd, ops) = coalesce(
        batch_dims,
        &[
            Operand {
                offset: 0,
                strides: sa[..r - 2].to_vec(),
            },
            Operand {
                offset: 0,
                strides: sb[..r - 2].to_vec(),
            },
        ],
    );
    let mut w = vec![word(m)?, word(n)?, word(kdim)?];
    for &d in &bd {
        w.push(word(d)?);
    }
    w.extend([word(a.layout.offset())?, word(sa[r - 2])?, word(sa[r - 1])?]);
    for &s in &ops[0].strides {
        w.push(word(s)?);
    }
    w.extend([word(b.layout.offset())?, word(sb[r - 2])?, word(sb[r - 1])?]);
    for &s in &ops[1].strides {
        w.push(word(s)?);
    }
    let mt = dev.metadata(&w)?;
    let br = bd.len() as u32;
    let tiles = (
        word(n.div_ceil(k::TILE as usize))?,
        word(m.div_ceil(k::TILE as usize))?,
    );
    if tiles.0 > MAX_GRID || tiles.1 > MAX_GRID {
        return Err(Error::invalid(
            "matmul",
            format!("a {m}×{n} result needs more than {MAX_GRID} tiles along one side"),
        ));
    }
    let direct = (
        word(n.div_ceil(k::DIRECT_COLS as usize))?,
        word(m.div_ceil(k::DIRECT_ROWS as usize))?,
    );
    let kernel = match product_kernel() {
        ProductKernel::Auto if dev.cpu_adapter => ProductKernel::Direct,
        ProductKernel::Auto => ProductKernel::Tiled {
            splits: auto_splits(tiles.0 as usize * tiles.1 as usize * batch, kdim),
        },
        pinned => pinned,
    };
    let c = &dev.client;
    let no_float = || Error::dtype("matmul", format!("multiplies floats, not {}", out.dtype));
    let mut base = 0usize;
    match kernel {
        ProductKernel::Tiled { splits } => {
            // Every range at least one K step deep, and every range non-empty.
            let steps = kdim.div_ceil(k::DEPTH as usize);
            let per_split = steps.div_ceil((splits as usize).clamp(1, steps));
            let splits = steps.div_ceil(per_split);
            let split_len = word(per_split * k::DEPTH as usize)?;
            let s = word(splits)?;
            let outputs = m * n;
            while base < batch {
                let chunk = (batch - base).min(MAX_GRID as usize / splits);
                let count = CubeCount::Static(tiles.0, tiles.1, word(chunk * splits)?);
                let dim = CubeDim::new_1d(256);
                let b0 = word(base)?;
                if splits == 1 {
                    with_float_type!(out.dtype, F, A => unsafe {
                        k::matmul::launch_unchecked::<F, A, F, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&result), arg(&mt), b0, s, split_len, br)
                    }, return Err(no_float()));
                } else {
                    let len = chunk * outputs;
                    word(splits * len)?;
                    let partials = dev.alloc("matmul", accumulator(out.dtype), splits * len)?;
                    let (sum_count, sum_dim) = crate::strided::grid(len, crate::strided::BLOCK);
                    let (len, out_base) = (word(len)?, word(base * outputs)?);
                    with_float_type!(out.dtype, F, A => unsafe {
                        k::matmul::launch_unchecked::<F, A, A, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&partials), arg(&mt), b0, s, split_len, br);
                        k::sum_splits::launch_unchecked::<F, A, R>(c, sum_count, sum_dim, arg(&partials), arg(&result), len, s, out_base)
                    }, return Err(no_float()));
                }
                base += chunk;
            }
        }
        _ => {
            if direct.0 > MAX_GRID || direct.1 > MAX_GRID {
                return Err(Error::invalid(
                    "matmul",
                    format!("a {m}×{n} result needs more than {MAX_GRID} cubes along one side"),
                ));
            }
            while base < batch {
                let chunk = (batch - base).min(MAX_GRID as usize) as u32;
                let b0 = word(base)?;
                // CPU drivers run barriers by switching invocations: the kernel without them.
                let count = CubeCount::Static(direct.0, direct.1, chunk);
                let dim = CubeDim::new_1d(k::DIRECT_COLS);
                with_float_type!(out.dtype, F, A => unsafe {
                    k::matmul_direct::launch_unchecked::<F, A, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&result), arg(&mt), b0, br)
                }, return Err(no_float()));
                base += chunk as usize;
            }
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_with_few_tiles_are_split_over_k() {
        // W1's products: batch-1 rows and the 10-column classifier are split; a
        // batch-256 weight gradient (208 tiles) and a 4096² product are not.
        let tiles = |m: usize, n: usize| m.div_ceil(64) * n.div_ceil(64);
        assert_eq!(auto_splits(tiles(1, 1024), 784), 12);
        assert_eq!(auto_splits(tiles(1, 10), 1024), 16);
        assert_eq!(auto_splits(tiles(256, 1024), 1024), 4);
        assert_eq!(auto_splits(tiles(784, 1024), 256), 1);
        assert_eq!(auto_splits(tiles(4096, 4096), 4096), 1);
        // Too short a K to split: fewer than two ranges of MIN_STEPS_PER_SPLIT steps.
        assert_eq!(auto_splits(tiles(1, 64), 100), 1);
        // The partial sums stay under 384 tiles' worth whatever the shape.
        for t in 1..SPLIT_BELOW {
            let splits = auto_splits(t, 1 << 20) as usize;
            assert!(splits * t < 384, "{t} tiles: {splits} ranges");
        }
    }
}
