//! `CpuStorage`: one buffer of elements per dtype ([`Buf`]: owned, or read in place
//! from memory that lives as long as the program), and the element traits the kernels
//! are generic over (how each dtype loads into and stores from its compute type).

use crate::quant::PackedInt8;
use half::{bf16, f16};
use kiln_tensor::Result;
use kiln_tensor::{DType, Element, HostData};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

/// The elements of a CPU buffer: a vector the buffer owns, or elements that live as
/// long as the program (weights built into the binary), read in place and copied into
/// a vector of their own the first time they are written.
#[derive(Clone)]
pub enum Buf<T: Copy + 'static> {
    /// Elements the buffer owns.
    Owned(Vec<T>),
    /// Elements read in place.
    Static(&'static [T]),
}

impl<T: Copy + 'static> Buf<T> {
    /// Whether the elements are read in place (not copied).
    pub fn is_static(&self) -> bool {
        matches!(self, Buf::Static(_))
    }

    /// The elements as a vector (a copy only for elements read in place).
    pub fn into_vec(self) -> Vec<T> {
        match self {
            Buf::Owned(v) => v,
            Buf::Static(s) => s.to_vec(),
        }
    }
}

impl<T: Copy + 'static> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Self {
        Buf::Owned(v)
    }
}

impl<T: Copy + 'static> FromIterator<T> for Buf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Buf::Owned(iter.into_iter().collect())
    }
}

impl<T: Copy + 'static> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Owned(v) => v,
            Buf::Static(s) => s,
        }
    }
}

impl<T: Copy + 'static> DerefMut for Buf<T> {
    /// The elements, writable: elements read in place are copied first (they may be
    /// in read-only memory, and other buffers may share them).
    fn deref_mut(&mut self) -> &mut [T] {
        if let Buf::Static(s) = *self {
            *self = Buf::Owned(s.to_vec());
        }
        match self {
            Buf::Owned(v) => v,
            Buf::Static(_) => unreachable!("copied above"),
        }
    }
}

impl<T: Copy + PartialEq + 'static> PartialEq for Buf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + std::fmt::Debug + 'static> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// The elements of an i8 buffer (quantised weights) and, once a product has read them
/// as a matrix, that matrix packed for the int8 kernels: weights are packed once, not
/// on every call. Writing the elements drops the packed form.
#[derive(Clone)]
pub struct Int8Buf {
    values: Buf<i8>,
    packed: OnceLock<Arc<PackedInt8>>,
}

impl Int8Buf {
    /// Whether the elements are read in place (see [`Buf::Static`]).
    pub fn is_static(&self) -> bool {
        self.values.is_static()
    }

    /// The elements as a vector.
    pub fn into_vec(self) -> Vec<i8> {
        self.values.into_vec()
    }

    /// The elements as a `rows × cols` matrix packed for the int8 products, packed on
    /// the first call for these sizes and kept.
    pub fn packed(&self, rows: usize, cols: usize) -> Result<Arc<PackedInt8>> {
        if let Some(p) = self
            .packed
            .get()
            .filter(|p| p.rows() == rows && p.cols() == cols)
        {
            return Ok(p.clone());
        }
        let p = Arc::new(PackedInt8::pack(rows, cols, &self.values)?);
        // Another thread may have packed it first; either copy is the same.
        let _ = self.packed.set(p.clone());
        Ok(p)
    }
}

impl From<Buf<i8>> for Int8Buf {
    fn from(values: Buf<i8>) -> Self {
        Int8Buf {
            values,
            packed: OnceLock::new(),
        }
    }
}

impl From<Vec<i8>> for Int8Buf {
    fn from(v: Vec<i8>) -> Self {
        Buf::Owned(v).into()
    }
}

impl FromIterator<i8> for Int8Buf {
    fn from_iter<I: IntoIterator<Item = i8>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<i8>>().into()
    }
}

impl Deref for Int8Buf {
    type Target = [i8];
    fn deref(&self) -> &[i8] {
        &self.values
    }
}

impl DerefMut for Int8Buf {
    /// The elements, writable; their packed form is dropped.
    fn deref_mut(&mut self) -> &mut [i8] {
        self.packed = OnceLock::new();
        &mut self.values
    }
}

impl PartialEq for Int8Buf {
    fn eq(&self, other: &Self) -> bool {
        *self.values == *other.values
    }
}

impl std::fmt::Debug for Int8Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.values.fmt(f)
    }
}

/// A CPU buffer: the elements of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    /// f32 values.
    F32(Buf<f32>),
    /// f64 values.
    F64(Buf<f64>),
    /// f16 values.
    F16(Buf<f16>),
    /// bf16 values.
    BF16(Buf<bf16>),
    /// i32 values.
    I32(Buf<i32>),
    /// u32 values.
    U32(Buf<u32>),
    /// bool values.
    Bool(Buf<bool>),
    /// i8 values (quantised weights).
    I8(Int8Buf),
}

impl CpuStorage {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::Bool(_) => DType::Bool,
            CpuStorage::I8(_) => DType::I8,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::I32(v) => v.len(),
            CpuStorage::U32(v) => v.len(),
            CpuStorage::Bool(v) => v.len(),
            CpuStorage::I8(v) => v.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves host data into a buffer.
    pub fn from_host(h: HostData) -> Self {
        match h {
            HostData::F32(v) => CpuStorage::F32(v.into()),
            HostData::F64(v) => CpuStorage::F64(v.into()),
            HostData::F16(v) => CpuStorage::F16(v.into()),
            HostData::BF16(v) => CpuStorage::BF16(v.into()),
            HostData::I32(v) => CpuStorage::I32(v.into()),
            HostData::U32(v) => CpuStorage::U32(v.into()),
            HostData::Bool(v) => CpuStorage::Bool(v.into()),
            HostData::I8(v) => CpuStorage::I8(v.into()),
        }
    }

    /// A buffer that reads `bytes` (little-endian elements of `dtype`, living as long
    /// as the program) in place, or `None` when they cannot be read in place: a
    /// big-endian CPU, bytes not aligned to the element size, a length that is not a
    /// whole number of elements, or bool (whose bytes may hold values other than 0
    /// and 1).
    pub fn from_static_bytes(bytes: &'static [u8], dtype: DType) -> Option<Self> {
        /// `bytes` as elements of `T`, if aligned and a whole number of them.
        fn view<T: Copy>(bytes: &'static [u8]) -> Option<&'static [T]> {
            let size = std::mem::size_of::<T>();
            if cfg!(target_endian = "big")
                || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
                || !bytes.len().is_multiple_of(size)
            {
                return None;
            }
            // SAFETY: aligned and in bounds (checked above); every bit pattern is a
            // valid value of the element types this is called with (floats, integers
            // and their 16-bit wrappers); the bytes are never written and live as long
            // as the program.
            Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / size) })
        }
        Some(match dtype {
            DType::F32 => CpuStorage::F32(Buf::Static(view(bytes)?)),
            DType::F64 => CpuStorage::F64(Buf::Static(view(bytes)?)),
            DType::F16 => CpuStorage::F16(Buf::Static(view(bytes)?)),
            DType::BF16 => CpuStorage::BF16(Buf::Static(view(bytes)?)),
            DType::I32 => CpuStorage::I32(Buf::Static(view(bytes)?)),
            DType::U32 => CpuStorage::U32(Buf::Static(view(bytes)?)),
            DType::I8 => CpuStorage::I8(Buf::Static(view(bytes)?).into()),
            DType::Bool => return None,
        })
    }

    /// Moves a buffer out as host data.
    pub fn into_host(self) -> HostData {
        match self {
            CpuStorage::F32(v) => HostData::F32(v.into_vec()),
            CpuStorage::F64(v) => HostData::F64(v.into_vec()),
            CpuStorage::F16(v) => HostData::F16(v.into_vec()),
            CpuStorage::BF16(v) => HostData::BF16(v.into_vec()),
            CpuStorage::I32(v) => HostData::I32(v.into_vec()),
            CpuStorage::U32(v) => HostData::U32(v.into_vec()),
            CpuStorage::Bool(v) => HostData::Bool(v.into_vec()),
            CpuStorage::I8(v) => HostData::I8(v.into_vec()),
        }
    }
}

/// Runs `$body` with `$v` bound to the vector in a `CpuStorage` and `$T` to its type.
macro_rules! with_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr) => {
        match $s {
            $crate::storage::CpuStorage::F32($v) => {
                type $T = f32;
                $body
            }
            $crate::storage::CpuStorage::F64($v) => {
                type $T = f64;
                $body
            }
            $crate::storage::CpuStorage::F16($v) => {
                type $T = half::f16;
                $body
            }
            $crate::storage::CpuStorage::BF16($v) => {
                type $T = half::bf16;
                $body
            }
            $crate::storage::CpuStorage::I32($v) => {
                type $T = i32;
                $body
            }
            $crate::storage::CpuStorage::U32($v) => {
                type $T = u32;
                $body
            }
            $crate::storage::CpuStorage::Bool($v) => {
                type $T = bool;
                $body
            }
            $crate::storage::CpuStorage::I8($v) => {
                type $T = i8;
                $body
            }
        }
    };
}
pub(crate) use with_storage;

impl CpuStorage {
    /// Whether the buffer reads its elements in place (see [`Buf::Static`]).
    pub fn is_static(&self) -> bool {
        with_storage!(self, v, _T => v.is_static())
    }
}

/// Like `with_storage!` for the float dtypes; `$other` runs for the rest.
macro_rules! with_float_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr, $other:expr) => {
        match $s {
            $crate::storage::CpuStorage::F32($v) => {
                type $T = f32;
                $body
            }
            $crate::storage::CpuStorage::F64($v) => {
                type $T = f64;
                $body
            }
            $crate::storage::CpuStorage::F16($v) => {
                type $T = half::f16;
                $body
            }
            $crate::storage::CpuStorage::BF16($v) => {
                type $T = half::bf16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float_storage;

/// An element a CPU kernel can hold: wraps a `Vec` of itself as storage.
pub trait CpuElement: Element {
    /// Wraps a vector as storage.
    fn wrap(v: Vec<Self>) -> CpuStorage;
}

macro_rules! cpu_element {
    ($($t:ty => $v:ident),*) => {$(
        impl CpuElement for $t {
            fn wrap(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$v(v.into())
            }
        }
    )*};
}
cpu_element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, u32 => U32, bool => Bool, i8 => I8);

/// A float dtype and the type it computes in (f32 for the 16-bit floats).
pub trait FloatKernel: CpuElement {
    /// The compute type.
    type C: crate::math::Real;
    /// Widens to the compute type.
    fn load(self) -> Self::C;
    /// Narrows from the compute type (round to nearest).
    fn store(c: Self::C) -> Self;
}

impl FloatKernel for f32 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        c
    }
}

impl FloatKernel for f64 {
    type C = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(c: f64) -> Self {
        c
    }
}

impl FloatKernel for f16 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        f16::from_f32(c)
    }
}

impl FloatKernel for bf16 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        bf16::from_f32(c)
    }
}

/// Like `with_storage!` for the dtypes that sum (floats and integers); `$other` runs
/// for bool.
macro_rules! with_sum_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr, $other:expr) => {
        match $s {
            $crate::storage::CpuStorage::I32($v) => {
                type $T = i32;
                $body
            }
            $crate::storage::CpuStorage::U32($v) => {
                type $T = u32;
                $body
            }
            other => $crate::storage::with_float_storage!(other, $v, $T => $body, $other),
        }
    };
}
pub(crate) use with_sum_storage;

/// An element that sums into an accumulator: floats in their compute type (so f16 and
/// bf16 round once, at the end), integers with two's-complement wrapping.
pub trait Accumulate: CpuElement {
    /// The running sum.
    type Acc: Copy + Send + Sync;
    /// The empty sum.
    fn zero() -> Self::Acc;
    /// `acc + x`.
    fn add(acc: Self::Acc, x: Self) -> Self::Acc;
    /// The sum as an element.
    fn finish(acc: Self::Acc) -> Self;
}

macro_rules! accumulate_float {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Acc = <$t as FloatKernel>::C;
            #[inline(always)]
            fn zero() -> Self::Acc {
                num_traits::Zero::zero()
            }
            #[inline(always)]
            fn add(acc: Self::Acc, x: Self) -> Self::Acc {
                acc + x.load()
            }
            #[inline(always)]
            fn finish(acc: Self::Acc) -> Self {
                <$t as FloatKernel>::store(acc)
            }
        }
    )*};
}
accumulate_float!(f32, f64, f16, bf16);

macro_rules! accumulate_int {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Acc = $t;
            #[inline(always)]
            fn zero() -> $t {
                0
            }
            #[inline(always)]
            fn add(acc: $t, x: $t) -> $t {
                acc.wrapping_add(x)
            }
            #[inline(always)]
            fn finish(acc: $t) -> $t {
                acc
            }
        }
    )*};
}
accumulate_int!(i32, u32);

#[cfg(test)]
mod tests {
    use super::*;

    /// Program-long bytes at an 8-byte boundary.
    fn program_bytes(values: &[f32]) -> &'static [u8] {
        let words: &'static mut [u64] = Vec::leak(vec![0u64; values.len().div_ceil(2)]);
        // SAFETY: the words are initialised bytes, at least 4 per value.
        let bytes: &'static mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), values.len() * 4) };
        for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn static_bytes_are_read_in_place_and_copied_on_the_first_write() {
        let bytes = program_bytes(&[1.0, -2.0, 3.5]);
        let mut a = CpuStorage::from_static_bytes(bytes, DType::F32).unwrap();
        let b = a.clone();
        assert!(a.is_static() && b.is_static());
        let CpuStorage::F32(v) = &mut a else {
            panic!("f32 bytes give f32 storage")
        };
        v[1] = 7.0;
        assert!(!a.is_static());
        assert_eq!(a.into_host(), HostData::F32(vec![1.0, 7.0, 3.5]));
        assert_eq!(b.clone().into_host(), HostData::F32(vec![1.0, -2.0, 3.5]));
        assert_eq!(&bytes[4..8], &(-2.0f32).to_le_bytes());
        assert!(b.is_static());
    }

    #[test]
    fn bytes_that_cannot_be_read_in_place_are_declined() {
        let bytes = program_bytes(&[1.0, 2.0, 3.0]);
        assert!(CpuStorage::from_static_bytes(&bytes[1..9], DType::F32).is_none());
        assert!(CpuStorage::from_static_bytes(&bytes[..6], DType::F32).is_none());
        assert!(CpuStorage::from_static_bytes(&bytes[..4], DType::F64).is_none());
        assert!(CpuStorage::from_static_bytes(&bytes[..2], DType::Bool).is_none());
        let halves = CpuStorage::from_static_bytes(&bytes[..4], DType::BF16).unwrap();
        assert_eq!(halves.len(), 2);
    }
}
