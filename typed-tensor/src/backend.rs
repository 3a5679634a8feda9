//! The `Backend` trait: what a device must provide for Kiln to run on it. It is small on
//! purpose: memory and transfers, one `execute` for every primitive of the op table, a
//! strided copy, and synchronisation. Views (reshape, permute, expand, slice) never
//! reach a backend: they are layout changes made by the tensor.

use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::fused::{ExprStep, FusedExpr, NativeFn};
use crate::layout::Layout;
use crate::op::{Arity, CmpOp, Op, TensorMeta, Window2d};
use crate::shape::Dims;
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

/// Columns that an `Op::Unfold2d` would write, read by a product without being stored
/// (a convolution's forward product and its weight gradient).
#[derive(Debug)]
pub struct WindowView<'a, B: Backend> {
    /// The images `[N, C, H, W]` the unfold reads.
    pub image: View<'a, B>,
    /// The unfold's window.
    pub window: Window2d,
    /// The columns' dims, `[C·kh·kw, N, OH·OW]`, as the unfold writes them contiguously.
    pub columns: Dims,
    /// How the product's operand reads those contiguous columns.
    pub layout: Layout,
}

impl<B: Backend> Clone for WindowView<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for WindowView<'_, B> {}

/// One operand of a product whose other operand may be read through a window.
// Passed by value once per product; boxing the larger variant would allocate in every
// step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ProductOperand<'a, B: Backend> {
    /// A value in memory.
    Stored(View<'a, B>),
    /// Columns read through a window ([`WindowView`]).
    Window(WindowView<'a, B>),
}

impl<B: Backend> Clone for ProductOperand<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for ProductOperand<'_, B> {}

/// Where a product's result goes when a fold takes it without storing it (a
/// convolution's input gradient): the result, contiguous, seen as the fold's columns
/// through `columns`, folded by `window` into `height × width` images.
#[derive(Clone, Copy, Debug)]
pub struct FoldInto {
    /// How the fold reads the product's contiguous result as `[C·kh·kw, N, L]`.
    pub columns: Layout,
    /// The fold's window.
    pub window: Window2d,
    /// The images' height.
    pub height: usize,
    /// The images' width.
    pub width: usize,
}

/// A device Kiln can run on.
///
/// The contract of [`Backend::execute`], by op class:
/// - elementwise ops (`Unary`, `Binary`, `Compare`, `Where`, `Cast`): every input view
///   already has the output's dims (broadcasting is done with stride-0 views);
/// - `MatMul`: inputs `[..batch, M, K]` and `[..batch, K, N]` with identical batch dims;
/// - every other op gets its inputs as the op table describes them;
/// - the result is a new contiguous buffer with `out`'s dims and dtype.
///
/// Errors only a kernel can see (an index out of range, an integer division by zero)
/// may be returned by the op or, on devices that run kernels asynchronously, by the
/// launching thread's next [`Backend::download`] or [`Backend::synchronize`].
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
    /// A buffer on `device` that reads `bytes` (little-endian elements of `dtype` that
    /// live as long as the program, such as weights built into the binary) in place,
    /// or `None` where this backend cannot: the caller uploads a decoded copy. The
    /// default cannot (a device buffer is always a copy).
    fn upload_static(
        _device: &Self::Device,
        _bytes: &'static [u8],
        _dtype: DType,
    ) -> Option<Self::Storage> {
        None
    }
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

    /// A contiguous buffer of `len` elements of `dtype` (contents unspecified). The
    /// default fills zeros through `execute`.
    fn alloc(device: &Self::Device, dtype: DType, len: usize) -> Result<Self::Storage> {
        let op = Op::Full {
            dims: vec![len],
            value: 0.0,
            dtype,
        };
        Self::execute(device, &op, &[], &TensorMeta::new(vec![len], dtype))
    }

    /// Runs one primitive op into `out`, a contiguous buffer of at least `meta`'s
    /// element count and its dtype, which a backend may reuse instead of allocating.
    /// The default runs [`Backend::execute`] and replaces `out`.
    fn execute_into(
        device: &Self::Device,
        op: &Op,
        inputs: &[View<'_, Self>],
        meta: &TensorMeta,
        out: &mut Self::Storage,
    ) -> Result<()> {
        *out = Self::execute(device, op, inputs, meta)?;
        Ok(())
    }

    /// Runs `ops`, which one kernel pass computes together
    /// ([`crate::attention::one_pass`]), each into its `outs` entry as
    /// [`Backend::execute_into`] would with its result's `metas` entry. `inputs` are the
    /// first op's; each op reads as many of them as it takes. The default runs the ops
    /// one after another.
    fn execute_one_pass_into(
        device: &Self::Device,
        ops: &[&Op],
        inputs: &[View<'_, Self>],
        metas: &[&TensorMeta],
        outs: &mut [&mut Self::Storage],
    ) -> Result<()> {
        one_pass_by_ops::<Self>(device, ops, inputs, metas, outs)
    }

    /// Runs a product (`op`, `Op::MatMul` or `Op::MatMulInt8`, over `operands` as
    /// [`Backend::execute`] takes them, result `out`) followed by `epilogue` over its
    /// result, as one call where the device fuses the two (cuBLASLt's bias epilogue, the
    /// CPU's int8 products with their bias and activation). The product's result is the
    /// epilogue's `Output(0)`, `inputs` its inputs (with `out`'s dims). `Ok(None)` leaves
    /// both to the caller; the default never fuses.
    fn product_with_epilogue(
        device: &Self::Device,
        op: &Op,
        operands: &[View<'_, Self>],
        out: &TensorMeta,
        epilogue: &FusedExpr,
        inputs: &[View<'_, Self>],
    ) -> Result<Option<Self::Storage>> {
        let _ = (device, op, operands, out, epilogue, inputs);
        Ok(None)
    }

    /// Runs `op` (`Op::MatMul`) over `lhs` and `rhs`, one of which may be columns read
    /// through a window, into `out` (a contiguous buffer of at least `meta`'s element
    /// count), without storing the columns. `Ok(false)` leaves it to the caller, who
    /// writes the columns to memory first (the default).
    fn windowed_product_into(
        device: &Self::Device,
        op: &Op,
        lhs: ProductOperand<'_, Self>,
        rhs: ProductOperand<'_, Self>,
        meta: &TensorMeta,
        out: &mut Self::Storage,
    ) -> Result<bool> {
        let _ = (device, op, lhs, rhs, meta, out);
        Ok(false)
    }

    /// Runs `op` (`Op::MatMul`) over `operands` (as [`Backend::execute`] takes them,
    /// result `product`) and folds the result as `fold` says into `out` (a contiguous
    /// buffer of at least `meta`'s element count, the fold's result), without storing
    /// the product. `Ok(false)` leaves it to the caller, who stores the product first
    /// (the default).
    fn folded_product_into(
        device: &Self::Device,
        op: &Op,
        operands: &[View<'_, Self>],
        product: &TensorMeta,
        fold: &FoldInto,
        meta: &TensorMeta,
        out: &mut Self::Storage,
    ) -> Result<bool> {
        let _ = (device, op, operands, product, fold, meta, out);
        Ok(false)
    }

    /// Runs `op`, a reduction, over the result of `prologue` (a fused expression of one
    /// result and no outputs, over `inputs`, each with `dims`) without storing that
    /// result: a plan's reduction whose input is computed by the group before it (a
    /// layer norm's squared deviations, a bias gradient's masked values). Returns the
    /// reduction's result (`out` its dims and dtype), or `Ok(None)` to leave both to the
    /// caller (the default): the expression into scratch, then the reduction.
    fn reduce_with_prologue(
        device: &Self::Device,
        op: &Op,
        prologue: &FusedExpr,
        inputs: &[View<'_, Self>],
        dims: &Dims,
        out: &TensorMeta,
    ) -> Result<Option<Self::Storage>> {
        let _ = (device, op, prologue, inputs, dims, out);
        Ok(None)
    }

    /// Runs `pass`, a chain of kernels over the same rows ([`crate::rows`]), as one
    /// pass over blocks of rows: `inputs` are the views its phases read (each over
    /// whole rows or one value per row), `outputs` contiguous buffers of `pass.rows`
    /// whole rows or values. `Ok(false)` leaves the kernels to the caller, who runs
    /// them one after another (the default).
    fn fused_rows(
        device: &Self::Device,
        pass: &crate::rows::RowPass,
        inputs: &[View<'_, Self>],
        outputs: &mut [&mut Self::Storage],
    ) -> Result<bool> {
        let _ = (device, pass, inputs, outputs);
        Ok(false)
    }

    /// Runs a fused elementwise kernel: each output (contiguous f32 of at least
    /// `dims`' element count) takes its result of `expr` at every element of `dims`;
    /// every input view has `dims` (broadcast by strides). `native` is the kernel as a
    /// compiled loop, where the caller has one. The default runs the steps op by op
    /// through [`Backend::execute`].
    fn fused_elementwise(
        device: &Self::Device,
        expr: &FusedExpr,
        native: Option<NativeFn>,
        inputs: &[View<'_, Self>],
        dims: &Dims,
        outputs: &mut [&mut Self::Storage],
    ) -> Result<()> {
        let _ = native;
        fused_by_ops::<Self>(device, expr, inputs, dims, outputs)
    }

    /// Whether [`Backend::fused_elementwise_groups`] runs many groups in fewer launches
    /// than one each, so that a caller with many small applications of one expression
    /// (an optimizer's update of every parameter) gains by gathering them. The
    /// default: no.
    fn groups_fused_elementwise(device: &Self::Device) -> bool {
        let _ = device;
        false
    }

    /// Runs `expr` once per group, each as [`Backend::fused_elementwise`] would: group
    /// `i` reads `inputs[i·k..(i+1)·k]` (`k = expr.inputs`) over `dims[i]` and writes
    /// `outputs[i·o..(i+1)·o]` (`o` the expression's result count). A multi-tensor
    /// kernel: backends that can launch it over many groups at once override it; the
    /// default runs the groups one by one.
    fn fused_elementwise_groups(
        device: &Self::Device,
        expr: &FusedExpr,
        inputs: &[View<'_, Self>],
        dims: &[Dims],
        outputs: &mut [&mut Self::Storage],
    ) -> Result<()> {
        let (k, o) = group_arity(expr, inputs, dims, outputs)?;
        for (i, d) in dims.iter().enumerate() {
            let ins = &inputs[i * k..(i + 1) * k];
            Self::fused_elementwise(device, expr, None, ins, d, &mut outputs[i * o..(i + 1) * o])?;
        }
        Ok(())
    }

    /// Runs `op`, an op that draws random numbers ([`Op::seed`]: `rand`, attention with
    /// dropout), on `inputs` with its seed mixed (xor) with the 64-bit value in `seed`
    /// (`i32` of dims `[2]`, low word first) on the device: what a captured training
    /// step's dropout draws with, the host writing the next step's seed into `seed`
    /// before each replay. The default reads `seed` to the host; devices that capture
    /// read it in the kernel.
    fn draw_with_device_seed(
        device: &Self::Device,
        op: &Op,
        inputs: &[View<'_, Self>],
        seed: View<'_, Self>,
        out: &TensorMeta,
    ) -> Result<Self::Storage> {
        let mixed = mix_device_seed(op, read_device_seed::<Self>(seed)?)?;
        Self::execute(device, &mixed, inputs, out)
    }

    /// An error naming `what()` when the calling thread is capturing (or checking the
    /// rules of a capture) on `device`: for host work a replay would not repeat, which
    /// the backend cannot see itself (a dynamic part planning its graph). `what` is
    /// only called then: this runs on hot paths. The default never captures.
    fn refuse_in_capture(device: &Self::Device, what: &dyn Fn() -> String) -> Result<()> {
        let _ = (device, what);
        Ok(())
    }

    /// Whether the calling thread is inside [`Backend::capture`] (or a check of a
    /// capture's rules) on `device`: work it starts now becomes part of that capture.
    /// The default never captures.
    fn capturing(device: &Self::Device) -> bool {
        let _ = device;
        false
    }

    /// Whether [`Backend::capture`] captures on `device` (CUDA graphs); the default
    /// never does.
    fn captures(device: &Self::Device) -> bool {
        let _ = device;
        false
    }

    /// Runs `step` once while capturing its device work as a [`Replay`]. An error (the
    /// step's, or what it did that a replay could not repeat) leaves the host's state
    /// as the step left it while its device work did not run: the caller cannot go on
    /// training. The default refuses (see [`Backend::captures`]).
    fn capture(
        device: &Self::Device,
        step: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Box<dyn Replay>> {
        let _ = (device, step);
        Err(Error::invalid(
            "capture",
            format!("the {} backend does not capture steps", Self::NAME),
        ))
    }

    /// Writes `src`'s values into `dst`'s own buffer in place, where everyone holding
    /// `dst` sees them (`src` has `dst`'s dims and dtype): state a training step
    /// updates where its replays read it, as batch-norm's running statistics.
    /// `Ok(false)` where the backend does not (the caller replaces `dst`); the default.
    fn assign(dst: &crate::RawTensor<Self>, src: &crate::RawTensor<Self>) -> Result<bool> {
        let _ = (dst, src);
        Ok(false)
    }

    /// An id of `storage`'s buffer that no other buffer of its device gets while the
    /// process runs, or `None` where the backend keeps none (the default): how a
    /// captured program knows it is handed the buffer it captured, without holding it
    /// (holding it would stop its owner updating it in place).
    fn buffer_id(storage: &Self::Storage) -> Option<u64> {
        let _ = storage;
        None
    }

    /// Writes `values` into `tensor`'s own buffer in place (a captured step's inputs,
    /// between replays). The default refuses: only capturing backends need it.
    fn write_host(tensor: &crate::RawTensor<Self>, values: &HostData) -> Result<()> {
        let _ = (tensor, values);
        Err(Error::invalid(
            "write_host",
            format!(
                "the {} backend does not write into buffers in place",
                Self::NAME
            ),
        ))
    }
}

/// A step captured on a device and replayed without the host issuing its work again
/// (a CUDA graph): inputs are written in place before a replay, results read after.
/// `Send`, so that a cache shared by threads can keep one (it replays on the thread
/// that captured it).
pub trait Replay: Send {
    /// Runs the captured work again.
    fn replay(&self) -> Result<()>;
}

/// An error unless `seed` is a device seed: `i32` of dims `[2]` (low word first),
/// contiguous from its buffer's start (kernels read its two words directly).
pub fn check_device_seed<B: Backend>(seed: View<'_, B>) -> Result<()> {
    let (dtype, l) = (B::storage_dtype(seed.storage), &seed.layout);
    if dtype != DType::I32 || l.dims().as_slice() != [2] || !l.is_contiguous() || l.offset() != 0 {
        return Err(Error::dtype(
            "rand",
            format!(
                "a device seed is i32 [2] (low word first, contiguous), got {dtype} {:?}",
                l.dims().as_slice()
            ),
        ));
    }
    Ok(())
}

/// The 64-bit seed a device seed holds (see [`check_device_seed`]), read to the host.
pub fn read_device_seed<B: Backend>(seed: View<'_, B>) -> Result<u64> {
    check_device_seed(seed)?;
    let HostData::I32(words) = B::download(seed.storage, &seed.layout)? else {
        return Err(Error::invalid(
            "rand",
            "an i32 buffer downloaded as another dtype",
        ));
    };
    Ok(words[0] as u32 as u64 | (words[1] as u32 as u64) << 32)
}

/// `op` (an op that draws, [`Op::seed`]) drawing with its own seed xor `seed`, as a
/// training step mixes each dropout's seed with the step's.
pub fn mix_device_seed(op: &Op, seed: u64) -> Result<Op> {
    match op.seed() {
        Some(own) => Ok(op.with_seed(own ^ seed)),
        None => Err(Error::invalid(
            op.name(),
            "draws no random numbers, so it takes no seed from device memory",
        )),
    }
}

/// [`Backend::execute_one_pass_into`] op by op: each op through
/// [`Backend::execute_into`] on as many of `inputs` as it takes.
pub fn one_pass_by_ops<B: Backend>(
    device: &B::Device,
    ops: &[&Op],
    inputs: &[View<'_, B>],
    metas: &[&TensorMeta],
    outs: &mut [&mut B::Storage],
) -> Result<()> {
    for ((op, meta), out) in ops.iter().zip(metas).zip(outs.iter_mut()) {
        let takes = match op.arity() {
            Arity::Exact(n) => n.min(inputs.len()),
            Arity::AtLeast(_) => inputs.len(),
        };
        B::execute_into(device, op, &inputs[..takes], meta, out)?;
    }
    Ok(())
}

/// The inputs and outputs per group of a [`Backend::fused_elementwise_groups`] call,
/// `(k, o)`; an error unless `inputs` and `outputs` hold exactly that many per group.
pub fn group_arity<B: Backend>(
    expr: &FusedExpr,
    inputs: &[View<'_, B>],
    dims: &[Dims],
    outputs: &[&mut B::Storage],
) -> Result<(usize, usize)> {
    let (k, o, g) = (expr.inputs, expr.results.len(), dims.len());
    if inputs.len() != g * k || outputs.len() != g * o {
        return Err(Error::invalid(
            "fused_elementwise_groups",
            format!(
                "{g} groups of an expression of {k} inputs and {o} outputs need {} inputs and \
                 {} outputs, got {} and {}",
                g * k,
                g * o,
                inputs.len(),
                outputs.len()
            ),
        ));
    }
    Ok((k, o))
}

/// [`Backend::fused_elementwise`] step by step with [`Backend::execute`].
pub fn fused_by_ops<B: Backend>(
    device: &B::Device,
    expr: &FusedExpr,
    inputs: &[View<'_, B>],
    dims: &Dims,
    outputs: &mut [&mut B::Storage],
) -> Result<()> {
    let f32_meta = TensorMeta::new(dims.to_vec(), DType::F32);
    let bool_meta = TensorMeta::new(dims.to_vec(), DType::Bool);
    let whole = Layout::contiguous(*dims);
    let mut regs: Vec<B::Storage> = Vec::with_capacity(expr.steps.len());
    let zero = B::execute(
        device,
        &Op::Full {
            dims: dims.to_vec(),
            value: 0.0,
            dtype: DType::F32,
        },
        &[],
        &f32_meta,
    )?;
    let zview = || View::<B> {
        storage: &zero,
        layout: whole,
    };
    for step in &expr.steps {
        let reg = |i: usize| View::<B> {
            storage: &regs[i],
            layout: whole,
        };
        let as_bool =
            |v: View<'_, B>| B::execute(device, &Op::Compare(CmpOp::Ne), &[v, zview()], &bool_meta);
        let to_f32 = |b: B::Storage| {
            B::execute(
                device,
                &Op::Cast { dtype: DType::F32 },
                &[View {
                    storage: &b,
                    layout: whole,
                }],
                &f32_meta,
            )
        };
        let value = match *step {
            ExprStep::Input(k) => {
                let v = inputs
                    .get(k)
                    .ok_or_else(|| Error::invalid("fused", format!("input {k} is missing")))?;
                // Registers are f32: bools and half floats widen as they are read.
                match B::storage_dtype(v.storage) {
                    DType::F32 => B::contiguous(device, *v)?,
                    _ => B::execute(device, &Op::Cast { dtype: DType::F32 }, &[*v], &f32_meta)?,
                }
            }
            ExprStep::Output(k) => B::contiguous(
                device,
                View {
                    storage: &*outputs[k],
                    layout: whole,
                },
            )?,
            ExprStep::Const(c) => B::execute(
                device,
                &Op::Full {
                    dims: dims.to_vec(),
                    value: c as f64,
                    dtype: DType::F32,
                },
                &[],
                &f32_meta,
            )?,
            ExprStep::Unary(op, a) => B::execute(device, &Op::Unary(op), &[reg(a)], &f32_meta)?,
            ExprStep::Binary(op, a, b) => {
                B::execute(device, &Op::Binary(op), &[reg(a), reg(b)], &f32_meta)?
            }
            ExprStep::Compare(op, a, b) => to_f32(B::execute(
                device,
                &Op::Compare(op),
                &[reg(a), reg(b)],
                &bool_meta,
            )?)?,
            ExprStep::Select(c, a, b) => {
                let c = as_bool(reg(c))?;
                B::execute(
                    device,
                    &Op::Where,
                    &[
                        View {
                            storage: &c,
                            layout: whole,
                        },
                        reg(a),
                        reg(b),
                    ],
                    &f32_meta,
                )?
            }
            ExprStep::ToBool(a) => to_f32(as_bool(reg(a))?)?,
        };
        regs.push(value);
    }
    for (out, &r) in outputs.iter_mut().zip(&expr.results) {
        let value = View {
            storage: &regs[r],
            layout: whole,
        };
        // An output of another dtype (bool, a half float) takes the register narrowed.
        **out = match B::storage_dtype(out) {
            DType::F32 => B::contiguous(device, value)?,
            dtype => B::execute(
                device,
                &Op::Cast { dtype },
                &[value],
                &TensorMeta::new(dims.to_vec(), dtype),
            )?,
        };
    }
    Ok(())
}
