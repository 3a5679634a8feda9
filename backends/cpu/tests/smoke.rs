//! Quick end-to-end checks of the CPU backend through the typed and raw APIs.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{BuilderExt, Conv2dOptions, DType, Rank2, RawTensor, Tensor};

#[test]
fn typed_matmul_and_softmax() -> kiln_tensor::Result<()> {
    let dev = CpuDevice;
    let a = Tensor::<Cpu, Rank2<2, 3>>::from_slice(&[1., 2., 3., 4., 5., 6.], &dev)?;
    let b = Tensor::<Cpu, Rank2<3, 2>>::from_slice(&[1., 0., 0., 1., 1., 1.], &dev)?;
    let c = a.matmul(&b)?;
    assert_eq!(c.to_vec()?, vec![4., 5., 10., 11.]);
    let s = c.softmax()?.to_vec()?;
    assert!((s[0] + s[1] - 1.0).abs() < 1e-6);
    let t = a.t()?.to_vec()?;
    assert_eq!(t, vec![1., 4., 2., 5., 3., 6.]);
    Ok(())
}

#[test]
fn raw_ops_views_and_errors() -> kiln_tensor::Result<()> {
    let dev = CpuDevice;
    let x = RawTensor::<Cpu>::from_vec((0..24).map(|v| v as f32).collect(), &[2, 3, 4], &dev)?;
    let s = x.sum(&[1], false)?;
    assert_eq!(s.dims().as_slice(), &[2, 4]);
    assert_eq!(
        s.to_vec::<f32>()?,
        vec![12., 15., 18., 21., 48., 51., 54., 57.]
    );
    let p = x.permute(&[2, 0, 1])?.contiguous()?;
    assert_eq!(&p.to_vec::<f32>()?[..4], &[0., 4., 8., 12.]);
    let bias = RawTensor::<Cpu>::from_vec(vec![1f32, 2., 3., 4.], &[4], &dev)?;
    let y = x.add(&bias)?;
    assert_eq!(&y.to_vec::<f32>()?[..5], &[1., 3., 5., 7., 5.]);
    let am = x.argmax(2, false)?;
    assert_eq!(am.dtype(), DType::I32);
    assert_eq!(am.to_vec::<i32>()?, vec![3; 6]);
    let err = x.matmul(&x).unwrap_err().to_string();
    assert!(err.contains("inner dims differ"), "{err}");
    let labels = RawTensor::<Cpu>::from_vec(vec![0i32, 9], &[2], &dev)?;
    let logits = RawTensor::<Cpu>::zeros(&[2, 4], DType::F32, &dev)?;
    let err = logits
        .ops()
        .cross_entropy(&logits, &labels, 0.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("out of range"), "{err}");
    Ok(())
}

#[test]
fn conv_and_pool_shapes() -> kiln_tensor::Result<()> {
    let dev = CpuDevice;
    let x = RawTensor::<Cpu>::from_vec(
        (0..2 * 3 * 6 * 6).map(|v| (v % 7) as f32).collect(),
        &[2, 3, 6, 6],
        &dev,
    )?;
    let w = RawTensor::<Cpu>::full(&[4, 3, 3, 3], 1.0, DType::F32, &dev)?;
    let mut g = x.ops();
    let y = g.conv2d(
        &x,
        &w,
        None,
        Conv2dOptions {
            padding: [1, 1],
            ..Conv2dOptions::default()
        },
    )?;
    assert_eq!(y.dims().as_slice(), &[2, 4, 6, 6]);
    let p = g.max_pool2d(&y, [2, 2], [2, 2], [0, 0])?;
    assert_eq!(p.dims().as_slice(), &[2, 4, 3, 3]);
    Ok(())
}

/// A window row whose every tap reads padding (kernel wider than the padded input
/// along one axis) once computed its source offset before the image and underflowed.
#[test]
fn windows_whose_rows_read_only_padding() {
    use kiln_tensor::testing::strategy::Input;
    use kiln_tensor::testing::{check_op, OpCase, RefTensor};
    use kiln_tensor::{Op, Window2d};
    let window = Window2d {
        kernel: [2, 3],
        stride: [1, 1],
        padding: [2, 2],
        dilation: [2, 2],
    };
    let (h, w) = (6, 1);
    let (oh, ow) = (
        window.out_size(0, h).unwrap(),
        window.out_size(1, w).unwrap(),
    );
    for dtype in [DType::F32, DType::I32] {
        let cols = (0..12 * oh * ow).map(|v| (v % 7) as f64 - 3.0).collect();
        let fold = OpCase {
            op: Op::Fold2d {
                window,
                height: h,
                width: w,
            },
            inputs: vec![Input::fresh(RefTensor::new(
                vec![12, 1, oh * ow],
                cols,
                dtype,
            ))],
        };
        check_op::<Cpu>(&CpuDevice, &fold).unwrap();
        let image = (0..2 * h * w).map(|v| v as f64).collect();
        let unfold = OpCase {
            op: Op::Unfold2d(window),
            inputs: vec![Input::fresh(RefTensor::new(vec![1, 2, h, w], image, dtype))],
        };
        check_op::<Cpu>(&CpuDevice, &unfold).unwrap();
    }
}
