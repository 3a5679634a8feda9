//! `Taped`: the CPU backend, capturing as a CUDA graph does — the device work of a
//! captured step recorded with the buffers it read and wrote, and replayed on those
//! buffers, with host copies, reads and synchronisations refused while capturing. The
//! tests of replayed dynamic programs run on it where there is no GPU (CI). Included
//! with `#[path = "…/taped.rs"] mod taped;`.

use kiln_cpu::{Cpu, CpuDevice, CpuStorage};
use kiln_tensor::{
    Backend, DType, Error, HostData, Layout, Op, RawTensor, Replay, Result, TensorMeta, View,
};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// The CPU backend, capturing like a graph.
#[derive(Clone, Copy, Debug, Default)]
pub struct Taped;

/// A buffer of [`Taped`]: a CPU buffer that captured work writes in place.
#[derive(Debug)]
pub struct Buffer {
    id: u64,
    cell: Arc<RwLock<CpuStorage>>,
}

static NEXT_BUFFER: AtomicU64 = AtomicU64::new(1);

impl Buffer {
    fn new(storage: CpuStorage) -> Self {
        Buffer {
            id: NEXT_BUFFER.fetch_add(1, Ordering::Relaxed),
            cell: Arc::new(RwLock::new(storage)),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, CpuStorage> {
        self.cell.read().unwrap()
    }
}

/// One recorded piece of device work: what it computes, from which buffers, into
/// which one.
struct Work {
    compute: Compute,
    inputs: Vec<(Arc<RwLock<CpuStorage>>, Layout)>,
    out: Arc<RwLock<CpuStorage>>,
}

enum Compute {
    Op(Op, TensorMeta),
    Contiguous,
}

impl Work {
    fn result(&self) -> Result<CpuStorage> {
        let guards: Vec<_> = self.inputs.iter().map(|(c, _)| c.read().unwrap()).collect();
        let views: Vec<View<'_, Cpu>> = (guards.iter().zip(&self.inputs))
            .map(|(g, (_, layout))| View {
                storage: &**g,
                layout: *layout,
            })
            .collect();
        match &self.compute {
            Compute::Op(op, meta) => Cpu::execute(&CpuDevice, op, &views, meta),
            Compute::Contiguous => Cpu::contiguous(&CpuDevice, views[0]),
        }
    }
}

thread_local! {
    /// The calling thread's capture: the work recorded so far, and what was refused.
    static TAPE: RefCell<Option<(Vec<Work>, Option<String>)>> = const { RefCell::new(None) };
}

fn capturing() -> bool {
    TAPE.with(|t| t.borrow().is_some())
}

/// An error while capturing: `what` is host work a replay would not repeat.
fn refuse(what: &str) -> Result<()> {
    TAPE.with(|t| match &mut *t.borrow_mut() {
        Some((_, refused)) => {
            refused.get_or_insert_with(|| format!("{what} cannot be captured"));
            Err(Error::Device(format!("{what} cannot be captured")))
        }
        None => Ok(()),
    })
}

/// Runs `compute` on `inputs` now, writing `out`, and records it when capturing.
fn run(compute: Compute, inputs: &[View<'_, Taped>], out: Arc<RwLock<CpuStorage>>) -> Result<()> {
    let work = Work {
        compute,
        inputs: inputs
            .iter()
            .map(|v| (v.storage.cell.clone(), v.layout))
            .collect(),
        out,
    };
    let value = work.result()?;
    *work.out.write().unwrap() = value;
    TAPE.with(|t| {
        if let Some((tape, _)) = &mut *t.borrow_mut() {
            tape.push(work);
        }
    });
    Ok(())
}

fn empty() -> Result<Buffer> {
    Ok(Buffer::new(Cpu::alloc(&CpuDevice, DType::F32, 0)?))
}

struct TapedReplay(Vec<Work>);

impl Replay for TapedReplay {
    fn replay(&self) -> Result<()> {
        for work in &self.0 {
            let value = work.result()?;
            *work.out.write().unwrap() = value;
        }
        Ok(())
    }
}

impl Backend for Taped {
    type Device = CpuDevice;
    type Storage = Buffer;
    const NAME: &'static str = "taped-cpu";

    fn device_name(_: &CpuDevice) -> String {
        "the taped CPU".into()
    }
    fn storage_dtype(s: &Buffer) -> DType {
        Cpu::storage_dtype(&s.read())
    }
    fn storage_len(s: &Buffer) -> usize {
        Cpu::storage_len(&s.read())
    }
    fn upload(dev: &CpuDevice, data: HostData) -> Result<Buffer> {
        refuse("a host copy")?;
        Ok(Buffer::new(Cpu::upload(dev, data)?))
    }
    fn download(s: &Buffer, layout: &Layout) -> Result<HostData> {
        refuse("a read")?;
        Cpu::download(&s.read(), layout)
    }
    fn execute(
        _: &CpuDevice,
        op: &Op,
        inputs: &[View<'_, Self>],
        out: &TensorMeta,
    ) -> Result<Buffer> {
        let buffer = empty()?;
        run(
            Compute::Op(op.clone(), out.clone()),
            inputs,
            buffer.cell.clone(),
        )?;
        Ok(buffer)
    }
    fn execute_into(
        _: &CpuDevice,
        op: &Op,
        inputs: &[View<'_, Self>],
        meta: &TensorMeta,
        out: &mut Buffer,
    ) -> Result<()> {
        run(
            Compute::Op(op.clone(), meta.clone()),
            inputs,
            out.cell.clone(),
        )
    }
    fn contiguous(_: &CpuDevice, input: View<'_, Self>) -> Result<Buffer> {
        let buffer = empty()?;
        run(Compute::Contiguous, &[input], buffer.cell.clone())?;
        Ok(buffer)
    }
    fn synchronize(_: &CpuDevice) -> Result<()> {
        refuse("a synchronisation")
    }
    fn alloc(dev: &CpuDevice, dtype: DType, len: usize) -> Result<Buffer> {
        Ok(Buffer::new(Cpu::alloc(dev, dtype, len)?))
    }
    fn assign(dst: &RawTensor<Self>, src: &RawTensor<Self>) -> Result<bool> {
        assert_eq!(dst.dims(), src.dims());
        run(
            Compute::Contiguous,
            &[View {
                storage: src.storage(),
                layout: *src.layout(),
            }],
            dst.storage().cell.clone(),
        )?;
        Ok(true)
    }
    fn buffer_id(s: &Buffer) -> Option<u64> {
        Some(s.id)
    }
    fn captures(_: &CpuDevice) -> bool {
        true
    }
    fn capturing(_: &CpuDevice) -> bool {
        capturing()
    }
    fn capture(_: &CpuDevice, step: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Replay>> {
        TAPE.with(|t| *t.borrow_mut() = Some((Vec::new(), None)));
        let ran = step();
        let (tape, refused) = TAPE.with(|t| t.borrow_mut().take()).expect("capturing");
        ran?;
        match refused {
            Some(msg) => Err(Error::Device(msg)),
            None => Ok(Box::new(TapedReplay(tape))),
        }
    }
}
