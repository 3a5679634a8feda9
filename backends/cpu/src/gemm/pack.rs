//! Packing: copies a strided block of A or B (any element type, any strides) into
//! the contiguous, zero-padded panel layout the microkernels stream through.
//!
//! Layout of one panel of `width` lanes (MR rows of A, or NR columns of B) over
//! `kc` steps of the reduction: `dst[p * width + i] = src(i, p)`. Lanes past the
//! matrix edge are zero so the kernels never need to know about edges in k or
//! in the lane direction.

use super::kernels::KernelSpec;
use super::{Elem, Isa, Load, SrcBits};

/// A strided source for packing, addressed as (lane i, reduction step p).
#[derive(Clone, Copy)]
pub(crate) struct PanelSrc<'a, X> {
    pub data: &'a [X],
    pub off: usize,
    /// Stride between lanes.
    pub ls: usize,
    /// Stride between reduction steps.
    pub ks: usize,
}

/// Packs lanes `[l0, l0 + lanes)` and steps `[p0, p0 + kc)` of `src` into `dst`
/// as consecutive panels of `width` lanes each; `dst` must hold
/// `lanes.div_ceil(width) * width * kc` elements.
/// The caller has checked (via `MatRef::check_bounds`) that every addressed
/// source element exists.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_block<T: Elem, X: Load<T>>(
    isa: Isa,
    src: PanelSrc<'_, X>,
    l0: usize,
    lanes: usize,
    p0: usize,
    kc: usize,
    width: usize,
    dst: &mut [T],
) {
    let panels = lanes.div_ceil(width);
    assert!(dst.len() >= panels * width * kc);
    #[cfg(target_arch = "x86_64")]
    if (width == 14 || width == 32) && (src.ls == 1 || src.ks == 1) && isa.avx512_packing() {
        let bits = X::bits(src.data);
        if let (false, Some(dst)) = (matches!(bits, SrcBits::Other), T::as_f32_mut(dst)) {
            let (off, ls, ks) = (src.off, src.ls, src.ks);
            // SAFETY (all arms): AVX-512F/BW/VL are available (checked above); the
            // source elements are in bounds per the caller's check; `dst` was
            // checked to hold all panels.
            unsafe {
                match bits {
                    SrcBits::F32(d) => {
                        x86::pack::<x86::F32>(d, off, ls, ks, l0, lanes, p0, kc, width, dst)
                    }
                    SrcBits::F16(d) => {
                        x86::pack::<x86::F16>(d, off, ls, ks, l0, lanes, p0, kc, width, dst)
                    }
                    SrcBits::Bf16(d) => {
                        x86::pack::<x86::Bf16>(d, off, ls, ks, l0, lanes, p0, kc, width, dst)
                    }
                    SrcBits::Other => unreachable!(),
                }
            }
            return;
        }
    }
    let _ = isa;
    if src.ls == 1 && src.ks != 1 {
        // Lanes contiguous (B row-major, A transposed): walk each source row across
        // all panels, so the reads stream through memory sequentially instead of
        // hopping a whole row (often a new page, out of the prefetchers' reach)
        // per reduction step.
        let off = src.off + l0 + p0 * src.ks;
        match width {
            32 => return pack_rows::<T, X, 32>(src.data, off, src.ks, lanes, kc, dst),
            16 => return pack_rows::<T, X, 16>(src.data, off, src.ks, lanes, kc, dst),
            14 => return pack_rows::<T, X, 14>(src.data, off, src.ks, lanes, kc, dst),
            8 => return pack_rows::<T, X, 8>(src.data, off, src.ks, lanes, kc, dst),
            6 => return pack_rows::<T, X, 6>(src.data, off, src.ks, lanes, kc, dst),
            4 => return pack_rows::<T, X, 4>(src.data, off, src.ks, lanes, kc, dst),
            _ => {}
        }
    }
    for (q, panel) in dst.chunks_exact_mut(width * kc).take(panels).enumerate() {
        let first = l0 + q * width;
        let rows = width.min(l0 + lanes - first);
        let off = src.off + first * src.ls + p0 * src.ks;
        pack_panel(src.data, off, src.ls, src.ks, rows, kc, width, panel);
    }
}

/// Packs a block for `spec`'s kernel: bf16 pairs for a pairs kernel (which the caller
/// picks for bf16 operands only), panels widened to `T` ([`pack_block`]) otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_for<T: Elem, X: Load<T>>(
    spec: &KernelSpec<T>,
    src: PanelSrc<'_, X>,
    l0: usize,
    lanes: usize,
    p0: usize,
    kc: usize,
    width: usize,
    dst: &mut [T],
) {
    if spec.pairs {
        let (SrcBits::Bf16(data), Some(dst)) = (X::bits(src.data), T::as_f32_mut(dst)) else {
            unreachable!("a pairs kernel runs on bf16 operands only");
        };
        let src = PanelSrc {
            data,
            off: src.off,
            ls: src.ls,
            ks: src.ks,
        };
        return pack_bf16_pairs(spec.isa, src, l0, lanes, p0, kc, width, dst);
    }
    pack_block(spec.isa, src, l0, lanes, p0, kc, width, dst)
}

/// Packs a bf16 block for the dot-product kernels: lanes `[l0, l0 + lanes)` and steps
/// `[p0, p0 + kc)` of `src` (bf16 bit patterns) as panels of `width` lanes holding two
/// steps per 32-bit slot, `dst[q * width + i] = src(i, 2q) | src(i, 2q + 1) << 16`
/// (the even step in the low half, as `vdpbf16ps` pairs them). Lanes past the edge and
/// the odd step past `kc` are zero. Panels keep [`pack_block`]'s stride of
/// `width * kc` slots (the driver addresses them so); each uses its first
/// `width * kc.div_ceil(2)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_bf16_pairs(
    isa: Isa,
    src: PanelSrc<'_, u16>,
    l0: usize,
    lanes: usize,
    p0: usize,
    kc: usize,
    width: usize,
    dst: &mut [f32],
) {
    let (pairs, panels) = (kc.div_ceil(2), lanes.div_ceil(width));
    assert!(dst.len() >= panels * width * kc);
    #[cfg(target_arch = "x86_64")]
    if src.ks == 1
        && (width == 14 || width == 32)
        && [src.off, src.ls, p0, kc].iter().all(|v| v % 2 == 0)
        && isa.avx512_packing()
    {
        // Steps contiguous and pairs word-aligned: each pair of steps is one 32-bit
        // word, so a panel is the f32 packing's transpose of those words.
        // SAFETY: any bits are a valid f32; `align_to` leaves out a misaligned head.
        let (head, words, _) = unsafe { src.data.align_to::<f32>() };
        if head.is_empty() {
            for (q, panel) in dst.chunks_exact_mut(width * kc).take(panels).enumerate() {
                let first = l0 + q * width;
                let rows = width.min(l0 + lanes - first);
                // SAFETY: AVX-512F/BW/VL are available (checked above); word
                // `(off + l*ls)/2 + p0/2 + p` for a lane l of this panel and p < kc/2
                // holds bf16 elements `off + l*ls + p0 + 2p` and the next, which the
                // caller checked to exist (so the word lies inside `words`); the panel
                // holds `width * pairs` slots.
                unsafe {
                    x86::pack::<x86::F32>(
                        words,
                        src.off / 2,
                        src.ls / 2,
                        1,
                        first,
                        rows,
                        p0 / 2,
                        pairs,
                        width,
                        &mut panel[..width * pairs],
                    )
                };
            }
            return;
        }
    }
    let _ = isa;
    for (q, panel) in dst.chunks_exact_mut(width * kc).take(panels).enumerate() {
        let first = l0 + q * width;
        let rows = width.min(l0 + lanes - first);
        let panel = &mut panel[..width * pairs];
        let base = src.off + first * src.ls + p0 * src.ks;
        if src.ls == 1 {
            // Lanes contiguous: interleave two source rows per slot row, the whole
            // panel in one vector-wide loop (a call per row of 14 or 32 lanes costs as
            // much as the row).
            kiln_tensor::simd::wide(
                #[inline(always)]
                || {
                    for (p, d) in panel.chunks_exact_mut(width).enumerate() {
                        let even = &src.data[base + 2 * p * src.ks..][..rows];
                        let odd = (2 * p + 1 < kc)
                            .then(|| &src.data[base + (2 * p + 1) * src.ks..][..rows]);
                        // Full panels of the kernels' widths as fixed-length loops,
                        // which vectorise whole.
                        match (rows, odd) {
                            (14, Some(odd)) => interleave_full::<14>(even, odd, d),
                            (32, Some(odd)) => interleave_full::<32>(even, odd, d),
                            _ => {
                                interleave(even, odd, &mut d[..rows]);
                                d[rows..].fill(0.0);
                            }
                        }
                    }
                },
            );
        } else {
            // Steps contiguous (ks == 1) or both strided: walk each lane's steps.
            let slot = |lo: u16, hi: u16| f32::from_bits(u32::from(lo) | u32::from(hi) << 16);
            for i in 0..rows {
                let at = |p: usize| src.data[base + i * src.ls + p * src.ks];
                for p in 0..pairs {
                    let odd = if 2 * p + 1 < kc { at(2 * p + 1) } else { 0 };
                    panel[p * width + i] = slot(at(2 * p), odd);
                }
            }
            if rows < width {
                for d in panel.chunks_exact_mut(width) {
                    d[rows..].fill(0.0);
                }
            }
        }
    }
}

/// [`interleave`] of a full slot row of `N` lanes.
#[inline(always)]
fn interleave_full<const N: usize>(even: &[u16], odd: &[u16], d: &mut [f32]) {
    let (even, odd, d): (&[u16; N], &[u16; N], &mut [f32; N]) = (
        even[..N].try_into().expect("N lanes"),
        odd[..N].try_into().expect("N lanes"),
        (&mut d[..N]).try_into().expect("N lanes"),
    );
    for i in 0..N {
        d[i] = f32::from_bits(u32::from(even[i]) | u32::from(odd[i]) << 16);
    }
}

/// One slot row of bf16 pairs: `d[i] = even[i] | odd[i] << 16` (`odd` zero past the last
/// step).
#[inline(always)]
fn interleave(even: &[u16], odd: Option<&[u16]>, d: &mut [f32]) {
    match odd {
        Some(odd) => {
            for ((d, &e), &o) in d.iter_mut().zip(even).zip(odd) {
                *d = f32::from_bits(u32::from(e) | u32::from(o) << 16);
            }
        }
        None => {
            for (d, &e) in d.iter_mut().zip(even) {
                *d = f32::from_bits(u32::from(e));
            }
        }
    }
}

/// Packs one panel: `dst[p * width + i] = src[off + i*ls + p*ks]` for `i < rows`, zero for
/// `rows <= i < width`. The caller has checked (via `MatRef::check_bounds`) that
/// every addressed source element exists; safe indexing keeps that honest.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_panel<T: Elem, X: Load<T>>(
    src: &[X],
    off: usize,
    ls: usize,
    ks: usize,
    rows: usize,
    kc: usize,
    width: usize,
    dst: &mut [T],
) {
    let dst = &mut dst[..width * kc];
    if rows == width {
        // Full panels are nearly all of the work: give them fixed-width loops the
        // compiler can turn into straight-line vector code.
        match width {
            32 => return pack_full::<T, X, 32>(src, off, ls, ks, kc, dst),
            16 => return pack_full::<T, X, 16>(src, off, ls, ks, kc, dst),
            14 => return pack_full::<T, X, 14>(src, off, ls, ks, kc, dst),
            8 => return pack_full::<T, X, 8>(src, off, ls, ks, kc, dst),
            6 => return pack_full::<T, X, 6>(src, off, ls, ks, kc, dst),
            4 => return pack_full::<T, X, 4>(src, off, ls, ks, kc, dst),
            _ => {}
        }
    }
    if rows < width {
        for d in dst.chunks_exact_mut(width) {
            d[rows..].fill(T::ZERO);
        }
    }
    if ls == 1 {
        // Lanes contiguous (B row-major, or A transposed): a short copy per step.
        for (p, d) in dst.chunks_exact_mut(width).enumerate() {
            let s = &src[off + p * ks..off + p * ks + rows];
            for (d, s) in d[..rows].iter_mut().zip(s) {
                *d = s.load();
            }
        }
    } else if ks == 1 {
        // Steps contiguous (A row-major, or B transposed): a transpose. Work in
        // chunks of steps so each lane's source run stays short and the panel
        // chunk being written stays in L1.
        const CHUNK: usize = 16;
        let mut p = 0;
        while p < kc {
            let len = CHUNK.min(kc - p);
            let dchunk = &mut dst[p * width..(p + len) * width];
            for i in 0..rows {
                let base = off + i * ls + p;
                let s = &src[base..base + len];
                for (d, s) in dchunk.chunks_exact_mut(width).zip(s) {
                    d[i] = s.load();
                }
            }
            p += len;
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(width).enumerate() {
            let base = off + p * ks;
            for (i, d) in d[..rows].iter_mut().enumerate() {
                *d = src[base + i * ls].load();
            }
        }
    }
}

/// [`pack_panel`] for a panel with all `W` lanes inside the matrix.
#[inline(always)]
fn pack_full<T: Elem, X: Load<T>, const W: usize>(
    src: &[X],
    off: usize,
    ls: usize,
    ks: usize,
    kc: usize,
    dst: &mut [T],
) {
    let (dst, _) = dst.as_chunks_mut::<W>();
    let dst = &mut dst[..kc];
    if ls == 1 {
        for (p, d) in dst.iter_mut().enumerate() {
            let s: &[X; W] = src[off + p * ks..][..W].try_into().unwrap();
            for i in 0..W {
                d[i] = s[i].load();
            }
        }
    } else if ks == 1 {
        // W sequential streams, one per lane; each step gathers one element from each.
        let rows: [&[X]; W] = std::array::from_fn(|i| &src[off + i * ls..][..kc]);
        for (p, d) in dst.iter_mut().enumerate() {
            for i in 0..W {
                d[i] = rows[i][p].load();
            }
        }
    } else {
        for (p, d) in dst.iter_mut().enumerate() {
            for (i, d) in d.iter_mut().enumerate() {
                *d = src[off + i * ls + p * ks].load();
            }
        }
    }
}

/// Row-wise packing of a whole block whose lanes are contiguous:
/// `dst[q][p][i] = src[off + p*ks + q*W + i]`, zero past `lanes`.
#[inline(always)]
fn pack_rows<T: Elem, X: Load<T>, const W: usize>(
    src: &[X],
    off: usize,
    ks: usize,
    lanes: usize,
    kc: usize,
    dst: &mut [T],
) {
    let full = lanes / W;
    let rem = lanes % W;
    let panels = full + (rem > 0) as usize;
    let dst = &mut dst[..panels * W * kc];
    for p in 0..kc {
        let row = &src[off + p * ks..][..lanes];
        let (chunks, tail) = row.as_chunks::<W>();
        for (q, s) in chunks.iter().enumerate() {
            let d: &mut [T; W] = (&mut dst[(q * kc + p) * W..][..W]).try_into().unwrap();
            for i in 0..W {
                d[i] = s[i].load();
            }
        }
        if rem > 0 {
            let d = &mut dst[(full * kc + p) * W..][..W];
            for (d, s) in d.iter_mut().zip(tail) {
                *d = s.load();
            }
            d[rem..].fill(T::ZERO);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX-512 packing into 14- or 32-lane f32 panels from f32, f16 or bf16
    //! sources (converted 16 lanes at a time on load): plain vector copies when
    //! lanes are contiguous, in-register 16x16 transposes when the reduction
    //! direction is. The compiler does neither well on its own (it emits
    //! scatters or scalar moves for the transpose, scalar conversions for f16).

    use std::arch::x86_64::*;

    /// A source element type the packers can load 16 at a time as f32.
    pub(super) trait Src {
        type E: Copy;
        const KIND: u8;
    }
    /// f32 source.
    pub(super) struct F32;
    /// IEEE half source (bit patterns).
    pub(super) struct F16;
    /// bfloat16 source (bit patterns).
    pub(super) struct Bf16;
    impl Src for F32 {
        type E = f32;
        const KIND: u8 = 0;
    }
    impl Src for F16 {
        type E = u16;
        const KIND: u8 = 1;
    }
    impl Src for Bf16 {
        type E = u16;
        const KIND: u8 = 2;
    }

    /// Loads the lanes of `m` (up to 16 elements) at `p` as f32, zero elsewhere.
    ///
    /// # Safety
    /// The enabled lanes are readable; AVX-512F/BW/VL.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load16<S: Src>(p: *const S::E, m: u16) -> __m512 {
        // SAFETY: masked-off lanes are not read and never fault.
        unsafe {
            match S::KIND {
                0 => _mm512_maskz_loadu_ps(m, p.cast()),
                1 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast())),
                // bf16 is the top half of an f32.
                _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm256_maskz_loadu_epi16(m, p.cast()),
                ))),
            }
        }
    }

    /// `pack_block` for width 14 or 32 with `ls == 1` or `ks == 1`, source element
    /// (i, p) at `data[off + i*ls + p*ks]`.
    ///
    /// # Safety
    /// AVX-512F/BW/VL; every source element for lanes `l0..l0+lanes`, steps
    /// `p0..p0+kc` exists; `dst` holds `lanes.div_ceil(width) * width * kc` floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn pack<S: Src>(
        data: &[S::E],
        off: usize,
        ls: usize,
        ks: usize,
        l0: usize,
        lanes: usize,
        p0: usize,
        kc: usize,
        width: usize,
        dst: &mut [f32],
    ) {
        let panels = lanes.div_ceil(width);
        let d = dst.as_mut_ptr();
        let s = data.as_ptr();
        if ls == 1 {
            // Each reduction step is a contiguous run of `lanes` elements: copy it
            // across all panels, walking source rows in order so reads stream.
            let full = lanes / width;
            let rem = lanes % width;
            for p in 0..kc {
                // SAFETY: lanes [l0, l0 + lanes) of step p0 + p are in bounds (caller);
                // panel q receives `width` floats at (q*kc + p)*width < dst.len().
                unsafe {
                    let row = s.add(off + l0 + (p0 + p) * ks);
                    for q in 0..full {
                        copy_lanes::<S>(
                            row.add(q * width),
                            d.add((q * kc + p) * width),
                            width,
                            width,
                        );
                    }
                    if rem > 0 {
                        copy_lanes::<S>(
                            row.add(full * width),
                            d.add((full * kc + p) * width),
                            width,
                            rem,
                        );
                    }
                }
            }
        } else {
            debug_assert_eq!(ks, 1);
            for q in 0..panels {
                let first = l0 + q * width;
                let rows = width.min(l0 + lanes - first);
                // SAFETY: lanes first..first+rows over steps p0..p0+kc are in bounds
                // (caller); the panel occupies width*kc floats at q*width*kc.
                unsafe {
                    transpose_panel::<S>(
                        s.add(off + first * ls + p0),
                        ls,
                        rows,
                        kc,
                        width,
                        d.add(q * width * kc),
                    )
                };
            }
        }
    }

    /// Copies `n <= width` elements from `from` to `to` as f32, zero-filling up to
    /// `width` (14 or 32).
    ///
    /// # Safety
    /// `from` is readable for `n` elements and `to` writable for `width` floats; AVX-512F/BW/VL.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn copy_lanes<S: Src>(from: *const S::E, to: *mut f32, width: usize, n: usize) {
        let m = if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
        // SAFETY: only the first n source lanes are read and `width` floats written.
        unsafe {
            if width == 32 {
                _mm512_storeu_ps(to, load16::<S>(from, m as u16));
                _mm512_storeu_ps(
                    to.add(16),
                    load16::<S>(from.wrapping_add(16), (m >> 16) as u16),
                );
            } else {
                _mm512_mask_storeu_ps(to, 0x3fff, load16::<S>(from, m as u16 & 0x3fff));
            }
        }
    }

    /// Packs one panel whose lanes are `ls` apart and whose steps are contiguous:
    /// 16 steps at a time, load up to 16 lanes x 16 steps, transpose, store 16 steps.
    ///
    /// # Safety
    /// Lane i < rows is readable for `kc` elements at `base + i*ls`; `dst` is
    /// writable for `width * kc` floats; AVX-512F/BW/VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn transpose_panel<S: Src>(
        base: *const S::E,
        ls: usize,
        rows: usize,
        kc: usize,
        width: usize,
        dst: *mut f32,
    ) {
        let mut p = 0;
        while p < kc {
            let steps = 16.min(kc - p);
            let kmask = if steps == 16 {
                0xffff
            } else {
                ((1u32 << steps) - 1) as u16
            };
            let mut g = 0;
            while g < width {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, r) in r.iter_mut().enumerate() {
                    let lane = g + i;
                    if lane < rows && lane < width {
                        // SAFETY: lane < rows and steps p..p+steps < kc are in bounds.
                        *r = unsafe { load16::<S>(base.add(lane * ls + p), kmask) };
                    }
                }
                let t = transpose16(r);
                // Lanes of this group that belong to the panel (14 of 16 for width 14).
                let smask: u16 = if width - g >= 16 {
                    0xffff
                } else {
                    (1u16 << (width - g)) - 1
                };
                for (q, t) in t.iter().enumerate().take(steps) {
                    // SAFETY: step p+q < kc, lanes g..g+16 masked to < width.
                    unsafe { _mm512_mask_storeu_ps(dst.add((p + q) * width + g), smask, *t) };
                }
                g += 16;
            }
            p += 16;
        }
    }

    /// Transposes a 16x16 block held as 16 row vectors.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // 32-bit interleave of row pairs, then 64-bit interleave of pair pairs:
        // b[4i + c] holds, in 128-bit lane L, rows 4i..4i+3 of column 4L + c.
        let mut a = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let mut b = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            let (x0, x1, y0, y1) = (a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
            b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(
                _mm512_castps_pd(x0),
                _mm512_castps_pd(y0),
            ));
            b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(
                _mm512_castps_pd(x0),
                _mm512_castps_pd(y0),
            ));
            b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(
                _mm512_castps_pd(x1),
                _mm512_castps_pd(y1),
            ));
            b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(
                _mm512_castps_pd(x1),
                _mm512_castps_pd(y1),
            ));
        }
        // A 4x4 transpose of 128-bit lanes for each column residue c.
        let mut out = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            let (b0, b1, b2, b3) = (b[c], b[4 + c], b[8 + c], b[12 + c]);
            let u0 = _mm512_shuffle_f32x4::<0x44>(b0, b1);
            let u1 = _mm512_shuffle_f32x4::<0xee>(b0, b1);
            let u2 = _mm512_shuffle_f32x4::<0x44>(b2, b3);
            let u3 = _mm512_shuffle_f32x4::<0xee>(b2, b3);
            out[c] = _mm512_shuffle_f32x4::<0x88>(u0, u2);
            out[4 + c] = _mm512_shuffle_f32x4::<0xdd>(u0, u2);
            out[8 + c] = _mm512_shuffle_f32x4::<0x88>(u1, u3);
            out[12 + c] = _mm512_shuffle_f32x4::<0xdd>(u1, u3);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ISA's packing agrees with the definition, for all stride patterns,
    /// widths, partial panels and k tails.
    fn check_pack<X: Load<f32>>(data: &[X]) {
        let cols = 70;
        let layouts = [(1, cols), (cols, 1), (2 * cols + 1, 2), (1, 0), (0, 1)];
        for &(ls, ks) in &layouts {
            for width in [4, 8, 14, 16, 32] {
                for &(l0, lanes, p0, kc) in &[
                    (0usize, 45usize, 0usize, 70usize),
                    (3, 33, 5, 17),
                    (1, 14, 2, 16),
                    (0, 1, 0, 1),
                    (7, 32, 1, 33),
                ] {
                    let src = PanelSrc {
                        data,
                        off: 3,
                        ls,
                        ks,
                    };
                    let panels = lanes.div_ceil(width);
                    for isa in [Isa::Portable, Isa::detect()] {
                        let mut dst = vec![f32::NAN; panels * width * kc];
                        pack_block(isa, src, l0, lanes, p0, kc, width, &mut dst);
                        for q in 0..panels {
                            for p in 0..kc {
                                for i in 0..width {
                                    let lane = l0 + q * width + i;
                                    let want = if lane < l0 + lanes {
                                        data[3 + lane * ls + (p0 + p) * ks].load()
                                    } else {
                                        0.0
                                    };
                                    let got = dst[(q * kc + p) * width + i];
                                    assert_eq!(
                                        got, want,
                                        "{isa:?} ls={ls} ks={ks} w={width} q={q} p={p} i={i}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pack_matches_definition_all_input_types() {
        let data: Vec<f32> = (0..10_000)
            .map(|i| (i % 4096) as f32 * 0.25 - 7.0)
            .collect();
        check_pack(&data);
        check_pack(
            &data
                .iter()
                .map(|&v| half::f16::from_f32(v))
                .collect::<Vec<_>>(),
        );
        check_pack(
            &data
                .iter()
                .map(|&v| half::bf16::from_f32(v))
                .collect::<Vec<_>>(),
        );
    }
}
