//! The `Backend` trait: what a device must provide for Kiln to run on it. It is small on
//! purpose: memory and transfers, one `execute` for every primitive of the op table, a
//! strided copy, and synchronisation. Views (reshape, permute, expand, slice) never
//! reach a backend: they are layout changes made by the tensor.

use crate::dtype::{DType, HostData};
use crate::error::Result;
use crate::layout::Layout;
use crate::op::{Op, TensorMeta};
use std::fmt::Debug;

/// A storage buffer seen through a layout: one input of an op.
#[derive(Debug)]
pub struct View<'a, B: Backend> {
    /// The buffer.
    pub storage: &'a B::Storage,
    /// How the op's logical input maps onto it.
    pub layout: Layout,
}

impl<B: Backend> Clone for View<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for View<'_, B> {}

/// A device Kiln can run on.
///
/// The contract of [`Backend::execute`], by op class:
/// - elementwise ops (`Unary`, `Binary`, `Compare`, `Where`, `Cast`): every input view
///   already has the output's dims (broadcasting is done with stride-0 views);
/// - `MatMul`: inputs `[..batch, M, K]` and `[..batch, K, N]` with identical batch dims;
/// - every other op gets its inputs as the op table describes them;
/// - the result is a new contiguous buffer with `out`'s dims and dtype.
pub trait Backend: Clone + Copy + Debug + Default + Send + Sync + 'static {
    /// Which device of this backend (a GPU ordinal, the CPU).
    type Device: Clone + Debug + PartialEq + Send + Sync + 'static;
    /// A buffer of elements on a device.
    type Storage: Debug + Send + Sync + 'static;

    /// The backend's name in messages.
    const NAME: &'static str;

    /// The device in words (for messages).
    fn device_name(device: &Self::Device) -> String;
    /// The dtype of a buffer.
    fn storage_dtype(storage: &Self::Storage) -> DType;
    /// The number of elements in a buffer.
    fn storage_len(storage: &Self::Storage) -> usize;
    /// Copies host values into a new buffer on `device`.
    fn upload(device: &Self::Device, data: HostData) -> Result<Self::Storage>;
    /// Copies the elements a layout selects back to the host, in row-major order.
    fn download(storage: &Self::Storage, layout: &Layout) -> Result<HostData>;
    /// Runs one primitive op (see the trait docs for the input contract).
    fn execute(
        device: &Self::Device,
        op: &Op,
        inputs: &[View<'_, Self>],
        out: &TensorMeta,
    ) -> Result<Self::Storage>;
    /// Copies the elements a layout selects into a new contiguous buffer.
    fn contiguous(device: &Self::Device, input: View<'_, Self>) -> Result<Self::Storage>;
    /// Waits until every queued operation on `device` has finished.
    fn synchronize(device: &Self::Device) -> Result<()>;
}
