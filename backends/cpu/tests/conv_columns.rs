//! Convolution products whose columns are never stored (`kiln_cpu::conv`) against the
//! ops they stand for: the forward product and the weight gradient against
//! `unfold2d` then the product, the input gradient against the product then `fold2d`.
//! Strides, padding, dilation, groups, kernels of 1×1 to 5×3, a last block of fewer
//! images, images read through a permutation and transposed weights; blocks small
//! enough that every case runs over several (at least two per thread of a pool of
//! two, as the blocks ask).

use kiln_cpu::conv::{folded_product_f32, windowed_product_f32, Blocking, Columns};
use kiln_cpu::{Cpu, CpuDevice, CpuStorage};
use kiln_tensor::{
    Backend, DType, Dims, Layout, Op, RawTensor, Result, TensorMeta, View, Window2d,
};

fn random(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    kiln_tensor::testing::lcg_tensor(dims, seed, &CpuDevice)
}

fn values(s: &CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v.to_vec(),
        other => panic!("unexpected dtype {}", other.dtype()),
    }
}

/// Largest difference relative to the largest magnitude of `want`.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}: element {i} is {g}, want {w} (scale {scale})"
        );
    }
}

/// One convolution's sizes.
#[derive(Clone, Copy, Debug)]
struct Case {
    images: usize,
    channels: usize,
    outputs: usize,
    groups: usize,
    hw: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

const CASES: &[Case] = &[
    Case {
        images: 7,
        channels: 3,
        outputs: 5,
        groups: 1,
        hw: [9, 8],
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
    },
    Case {
        images: 8,
        channels: 4,
        outputs: 6,
        groups: 2,
        hw: [11, 7],
        kernel: [5, 3],
        stride: [2, 1],
        padding: [2, 0],
        dilation: [1, 2],
    },
    Case {
        images: 9,
        channels: 2,
        outputs: 4,
        groups: 1,
        hw: [6, 6],
        kernel: [1, 1],
        stride: [2, 2],
        padding: [0, 0],
        dilation: [1, 1],
    },
    Case {
        images: 10,
        channels: 6,
        outputs: 3,
        groups: 3,
        hw: [10, 12],
        kernel: [3, 2],
        stride: [1, 3],
        padding: [1, 1],
        dilation: [2, 1],
    },
];

/// Blocks of one and two images (the last block one image short where the count is
/// odd).
fn block_sizes(c: &Case) -> Result<Vec<Blocking>> {
    let w = window(c);
    let per_image = c.channels
        * c.kernel[0]
        * c.kernel[1]
        * w.out_size(0, c.hw[0])?
        * w.out_size(1, c.hw[1])?
        * 4;
    let blocking = |bytes| Blocking {
        bytes,
        min_columns: 0,
    };
    Ok(vec![blocking(1), blocking(2 * per_image)])
}

fn window(c: &Case) -> Window2d {
    Window2d {
        kernel: c.kernel,
        stride: c.stride,
        padding: c.padding,
        dilation: c.dilation,
    }
}

/// The images `[N, C, H, W]`, read through a permutation of `[C, N, H, W]` (as a
/// convolution's output is).
fn images(c: &Case) -> Result<RawTensor<Cpu>> {
    random(&[c.channels, c.images, c.hw[0], c.hw[1]], 1)?.permute(&[1, 0, 2, 3])
}

/// The columns as `unfold2d` writes them, and their dims.
fn unfolded(c: &Case, x: &RawTensor<Cpu>) -> Result<(CpuStorage, Dims)> {
    let w = window(c);
    let l = c.channels * c.kernel[0] * c.kernel[1];
    let pos = w.out_size(0, c.hw[0])? * w.out_size(1, c.hw[1])?;
    let dims = Dims::new(&[l, c.images, pos])?;
    let meta = TensorMeta::new(dims.as_slice().to_vec(), DType::F32);
    Ok((
        Cpu::execute(&CpuDevice, &Op::Unfold2d(w), &[x.view()], &meta)?,
        dims,
    ))
}

/// Blocks of one image each.
const ONE_IMAGE: Blocking = Blocking {
    bytes: 1,
    min_columns: 0,
};

/// Runs `f` in a pool of two threads (the blocks' count is checked against it).
fn in_two_threads(f: impl FnOnce() -> Result<()> + Send) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a pool");
    pool.install(f)
}

#[test]
fn forward_products_over_blocks_are_the_unfold_then_the_product() -> Result<()> {
    in_two_threads(forward)
}

fn forward() -> Result<()> {
    for c in CASES {
        let x = images(c)?;
        let (cols, dims) = unfolded(c, &x)?;
        let (rows, wide) = (dims[0], dims[1] * dims[2]);
        let pg = rows / c.groups;
        let og = c.outputs / c.groups;
        let seen = Layout::contiguous(Dims::new(&[c.groups, pg, wide])?);
        // The weights `[g, O/g, pg]`, read transposed from `[g, pg, O/g]`.
        let w = random(&[c.groups, pg, og], 2)?.permute(&[0, 2, 1])?;
        let meta = TensorMeta::new(vec![c.groups, og, wide], DType::F32);
        let want = Cpu::execute(
            &CpuDevice,
            &Op::MatMul,
            &[
                w.view(),
                View {
                    storage: &cols,
                    layout: seen,
                },
            ],
            &meta,
        )?;
        for block in block_sizes(c)? {
            let mut out = vec![f32::NAN; c.groups * og * wide + 1];
            let xs = x.view();
            let columns = Columns {
                image: (xs.storage, &xs.layout),
                window: &window(c),
                dims: &dims,
                layout: &seen,
            };
            let wv = w.view();
            assert!(
                windowed_product_f32(
                    (wv.storage, &wv.layout),
                    columns,
                    &mut out[..c.groups * og * wide],
                    block
                )?,
                "{c:?}: declined"
            );
            assert!(
                out[c.groups * og * wide].is_nan(),
                "{c:?}: wrote past the result"
            );
            assert_close(
                &out[..c.groups * og * wide],
                &values(&want),
                &format!("{c:?}, blocks {block:?}"),
            );
        }
    }
    Ok(())
}

#[test]
fn weight_gradients_over_blocks_are_the_unfold_then_the_product() -> Result<()> {
    in_two_threads(weight_gradients)
}

fn weight_gradients() -> Result<()> {
    for c in CASES {
        let x = images(c)?;
        let (cols, dims) = unfolded(c, &x)?;
        let (rows, wide) = (dims[0], dims[1] * dims[2]);
        let (pg, og) = (rows / c.groups, c.outputs / c.groups);
        let seen = Layout::contiguous(Dims::new(&[c.groups, pg, wide])?).permute(&[0, 2, 1])?;
        // The output gradient `[g, O/g, N·L]`, read through a permutation.
        let dy = random(&[c.groups, wide, og], 3)?.permute(&[0, 2, 1])?;
        let meta = TensorMeta::new(vec![c.groups, og, pg], DType::F32);
        let want = Cpu::execute(
            &CpuDevice,
            &Op::MatMul,
            &[
                dy.view(),
                View {
                    storage: &cols,
                    layout: seen,
                },
            ],
            &meta,
        )?;
        for block in block_sizes(c)? {
            let mut out = vec![f32::NAN; c.groups * og * pg];
            let xs = x.view();
            let columns = Columns {
                image: (xs.storage, &xs.layout),
                window: &window(c),
                dims: &dims,
                layout: &seen,
            };
            let dv = dy.view();
            assert!(
                windowed_product_f32((dv.storage, &dv.layout), columns, &mut out, block)?,
                "{c:?}: declined"
            );
            assert_close(&out, &values(&want), &format!("{c:?}, blocks {block:?}"));
        }
    }
    Ok(())
}

#[test]
fn input_gradients_over_blocks_are_the_product_then_the_fold() -> Result<()> {
    in_two_threads(input_gradients)
}

fn input_gradients() -> Result<()> {
    for c in CASES {
        let w = window(c);
        let taps = c.kernel[0] * c.kernel[1];
        let rows = c.channels * taps;
        let pos = w.out_size(0, c.hw[0])? * w.out_size(1, c.hw[1])?;
        let wide = c.images * pos;
        let (pg, og) = (rows / c.groups, c.outputs / c.groups);
        // `Wᵀ` `[g, pg, O/g]` read transposed, the output gradient `[g, O/g, N·L]`.
        let wt = random(&[c.groups, og, pg], 4)?.permute(&[0, 2, 1])?;
        let dy = random(&[c.groups, wide, og], 5)?.permute(&[0, 2, 1])?;
        let pmeta = TensorMeta::new(vec![c.groups, pg, wide], DType::F32);
        let product = Cpu::execute(&CpuDevice, &Op::MatMul, &[wt.view(), dy.view()], &pmeta)?;
        let columns = Layout::contiguous(Dims::new(&[rows, c.images, pos])?);
        let fold = Op::Fold2d {
            window: w,
            height: c.hw[0],
            width: c.hw[1],
        };
        let fmeta = TensorMeta::new(vec![c.images, c.channels, c.hw[0], c.hw[1]], DType::F32);
        let want = Cpu::execute(
            &CpuDevice,
            &fold,
            &[View {
                storage: &product,
                layout: columns,
            }],
            &fmeta,
        )?;
        for block in block_sizes(c)? {
            let mut out = vec![f32::NAN; fmeta.dims.iter().product()];
            let (a, b) = (wt.view(), dy.view());
            let done = folded_product_f32(
                (a.storage, &a.layout),
                (b.storage, &b.layout),
                &columns,
                &w,
                c.hw,
                &mut out,
                block,
            )?;
            assert!(done, "{c:?}, blocks {block:?}: declined");
            assert_close(&out, &values(&want), &format!("{c:?}, blocks {block:?}"));
        }
    }
    Ok(())
}

/// Forms the blocks do not take are declined, nothing assumed: columns read through a
/// layout that is neither the forward nor the weight gradient's, and a fold of a
/// product that is not contiguous columns.
#[test]
fn other_forms_are_declined() -> Result<()> {
    in_two_threads(other_forms)
}

fn other_forms() -> Result<()> {
    let c = &CASES[0];
    let x = images(c)?;
    let (_, dims) = unfolded(c, &x)?;
    let (rows, wide) = (dims[0], dims[1] * dims[2]);
    // The columns sliced: no convolution's product reads them so.
    let sliced = Layout::contiguous(Dims::new(&[1, rows, wide])?).slice(1, 0, rows - 1, 1)?;
    let w = random(&[1, 4, rows - 1], 6)?;
    let xs = x.view();
    let columns = Columns {
        image: (xs.storage, &xs.layout),
        window: &window(c),
        dims: &dims,
        layout: &sliced,
    };
    let mut out = vec![0.0; 4 * wide];
    let wv = w.view();
    assert!(!windowed_product_f32(
        (wv.storage, &wv.layout),
        columns,
        &mut out,
        ONE_IMAGE,
    )?);
    // A fold reading the product transposed.
    let wt = random(&[1, rows, 5], 7)?;
    let dy = random(&[1, 5, wide], 8)?;
    let columns = Layout::contiguous(Dims::new(&[dims[2], c.images, rows])?).permute(&[2, 1, 0])?;
    let mut out = vec![0.0; c.images * c.channels * c.hw[0] * c.hw[1]];
    let (a, b) = (wt.view(), dy.view());
    assert!(!folded_product_f32(
        (a.storage, &a.layout),
        (b.storage, &b.layout),
        &columns,
        &window(c),
        c.hw,
        &mut out,
        ONE_IMAGE,
    )?);
    Ok(())
}
