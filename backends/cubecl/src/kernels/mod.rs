//! The `#[cube]` kernels, one module per op family. Every kernel takes its inputs as
//! strided views (offset, strides and dims in a small u32 metadata buffer) and writes a
//! contiguous output; the op is comptime data, so CubeCL compiles one specialised
//! kernel per op, dtype and rank and caches it.

pub mod attention;
pub mod attention_flash;
pub mod attention_mma;
pub mod attention_rows;
pub mod common;
pub mod elementwise;
pub mod fused;
pub mod index;
pub mod int8;
pub mod matmul;
pub mod random;
pub mod reduce;
pub mod rows;
pub mod window;
