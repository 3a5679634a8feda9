//! Matrix multiplication kernels (placeholder: a straightforward blocked loop, to be
//! replaced by the packed AVX-512 kernel).

/// A strided matrix view: element (i, j) is data[offset + i*row_stride + j*col_stride].
#[derive(Clone, Copy)]
pub struct MatRef<'a, T> {
    /// The backing elements.
    pub data: &'a [T],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Distance between rows.
    pub row_stride: usize,
    /// Distance between columns.
    pub col_stride: usize,
}

/// Element types the f32 GEMM reads (converted to f32 while packing).
pub trait GemmInput: Copy + Send + Sync + 'static {
    /// Widens to f32.
    fn to_f32(self) -> f32;
}

impl GemmInput for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}
impl GemmInput for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}
impl GemmInput for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// c (m×n row-major) = a·b (or += when `accumulate`), in f32.
pub fn sgemm<A: GemmInput, B: GemmInput>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
) {
    assert_eq!(c.len(), m * n);
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        if !accumulate {
            row.fill(0.0);
        }
        for p in 0..k {
            let av = a.data[a.offset + i * a.row_stride + p * a.col_stride].to_f32();
            for (j, cv) in row.iter_mut().enumerate() {
                *cv += av * b.data[b.offset + p * b.row_stride + j * b.col_stride].to_f32();
            }
        }
    }
}

/// c (m×n row-major) = a·b (or += when `accumulate`), in f64.
pub fn dgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<f64>,
    b: MatRef<f64>,
    c: &mut [f64],
    accumulate: bool,
) {
    assert_eq!(c.len(), m * n);
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        if !accumulate {
            row.fill(0.0);
        }
        for p in 0..k {
            let av = a.data[a.offset + i * a.row_stride + p * a.col_stride];
            for (j, cv) in row.iter_mut().enumerate() {
                *cv += av * b.data[b.offset + p * b.row_stride + j * b.col_stride];
            }
        }
    }
}
