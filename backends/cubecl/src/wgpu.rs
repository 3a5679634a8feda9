//! The wgpu runtime (Vulkan on Linux, Metal, DX12) through CubeCL's WGSL compiler.
//!
//! Adapters are picked here rather than by CubeCL's default device, which skips
//! software adapters: hardware adapters come first, then software ones, so Mesa's
//! lavapipe (a CPU Vulkan driver) serves CI machines without a GPU. The WGSL path is
//! used because CubeCL's SPIR-V path crashed lavapipe (Mesa 22.3) while building a
//! matmul pipeline. wgpu has no f64 or bf16 in compute shaders, so this runtime holds
//! f32, i32, u32 and bool, and f16 where the adapter offers `SHADER_F16` (GPUs, and
//! lavapipe from Mesa 23: `scripts/test.sh` installs one).
//!
//! Running out of memory is caught twice over: a GPU opens limited to 90% of its
//! largest device-local Vulkan heap (Kiln's own [`Error::OutOfMemory`], before the
//! driver is asked), and where the driver still refuses a buffer (other processes hold
//! the memory, or the limit was lifted) an error scope around the allocation turns its
//! refusal into the same error. Any other error the driver reports outside a scope is
//! kept and returned at the next synchronisation, instead of wgpu's default handler
//! panicking.
//!
//! A synchronisation or a read waits on the calling thread, polling the queue for up to
//! [`wait_spin_us`] microseconds before it blocks (GPU adapters; lavapipe blocks at
//! once, its work needing the cores): a short step's end is seen as it happens rather
//! than after a blocked thread's wake-up.

pub use cubecl::wgpu::{set_wait_spin_us, wait_spin_us, DEFAULT_WAIT_SPIN_US};

use crate::device::{CubeDevice, DeviceState, KilnRuntime, Opened};
use cubecl::server::Handle;
use cubecl::wgpu::{init_device, RuntimeOptions, WgpuRuntime, WgpuSetup};
use kiln_tensor::{DType, Error, Result};
use std::sync::{Arc, Mutex};

/// What to install when no adapter is found.
pub const INSTALL_HINT: &str = "install a Vulkan driver: on Debian/Ubuntu `apt-get install \
     mesa-vulkan-drivers` gives Mesa's lavapipe (a CPU Vulkan driver that needs no GPU); \
     on a GPU machine, the vendor's driver with its Vulkan ICD (for NVIDIA, point \
     VK_DRIVER_FILES at nvidia_icd.json); the Vulkan loader is the libvulkan1 package";

/// What a wgpu device keeps beside CubeCL's client.
pub struct WgpuExtra {
    /// The device CubeCL runs on, for error scopes around allocations.
    device: wgpu::Device,
    /// The first error the driver reported outside any error scope, not yet returned.
    driver_error: Arc<Mutex<Option<String>>>,
}

impl WgpuExtra {
    /// The wgpu device CubeCL runs on, for work outside Kiln on the same device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }
}

impl KilnRuntime for WgpuRuntime {
    const NAME: &'static str = "wgpu";
    const GROUPS_FUSED_ELEMENTWISE: bool = true;
    type Extra = WgpuExtra;
    type Bits16 = half::f16;

    fn open(ordinal: usize) -> Result<Opened<Self>> {
        let options = runtime_options()?;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::PRIMARY,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let mut adapters =
            cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        // Hardware first (discrete, integrated, virtual), software (lavapipe) last.
        adapters.sort_by_key(|a| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        });
        let found = adapters.len();
        if ordinal >= found {
            return Err(Error::Device(format!(
                "no wgpu adapter {ordinal} (found {found}): {INSTALL_HINT}"
            )));
        }
        let adapter = adapters.swap_remove(ordinal);
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) =
            cubecl::future::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                // Everything the adapter offers (CubeCL reads the device's features to
                // pick instructions), except mappable primary buffers and the
                // experimental features, which a device refuses unless asked for
                // through `ExperimentalFeatures` (the NVIDIA driver offers several).
                required_features: adapter.features().difference(
                    wgpu::Features::MAPPABLE_PRIMARY_BUFFERS
                        | wgpu::Features::all_experimental_mask(),
                ),
                required_limits: limits.clone(),
                ..Default::default()
            }))
            .map_err(|e| {
                Error::Device(format!(
                    "the wgpu adapter {} refused a device: {e}; {INSTALL_HINT}",
                    info.name
                ))
            })?;
        let driver_error = Arc::new(Mutex::new(None));
        let slot = driver_error.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            slot.lock()
                .expect("driver error slot")
                .get_or_insert_with(|| error.to_string());
        }));
        // A CPU adapter's memory is the host's, and its heap size a nominal figure (Mesa
        // 22.3's lavapipe says 2 GiB on any machine): only a GPU's heap is a limit.
        let default_memory_limit = match info.device_type {
            wgpu::DeviceType::Cpu => None,
            _ => largest_device_heap(&adapter).map(|bytes| bytes / 10 * 9),
        };
        let extra = WgpuExtra {
            device: device.clone(),
            driver_error,
        };
        let backend = info.backend;
        let setup = WgpuSetup {
            instance,
            adapter,
            device,
            queue,
            backend,
        };
        // f16 where the adapter computes and stores it (NVIDIA, AMD, Intel and Apple
        // GPUs; lavapipe since Mesa 23): the half floats compute in f32 and round once,
        // as on the CPU. WGSL has no bf16.
        // i8 as bytes read four to a word (int8 weights): WGSL has no 8-bit type.
        let mut dtypes = vec![DType::F32, DType::I32, DType::U32, DType::Bool, DType::I8];
        if setup.device.features().contains(wgpu::Features::SHADER_F16) {
            dtypes.push(DType::F16);
        }
        let cube_device = init_device(setup, options);
        let max_buffer_bytes =
            (limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        Ok(Opened {
            device: cube_device,
            name: format!(
                "{} ({:?}, {:?}, driver {} {})",
                info.name, info.backend, info.device_type, info.driver, info.driver_info
            ),
            max_buffer_bytes,
            dtypes,
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
            default_memory_limit,
            extra,
        })
    }

    fn guard_allocation(
        state: &DeviceState<Self>,
        bytes: u64,
        allocate: &mut dyn FnMut() -> Handle,
    ) -> Result<Handle> {
        // Error scopes are per thread, and CubeCL creates the buffer on this one.
        let scope = state
            .extra
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let handle = allocate();
        let Some(refusal) = cubecl::future::block_on(scope.pop()) else {
            return Ok(handle);
        };
        // The refused buffer is invalid: give its page back now, or CubeCL's pool would
        // hand it to the next allocation of its size.
        drop(handle);
        state.client.memory_cleanup();
        Err(Error::OutOfMemory {
            device: format!("{} (the driver refused it: {refusal})", state.name),
            bytes: bytes as usize,
        })
    }

    fn take_driver_error(state: &DeviceState<Self>) -> Option<Error> {
        let text = state
            .extra
            .driver_error
            .lock()
            .expect("driver error slot")
            .take()?;
        Some(Error::Device(format!(
            "{}: the driver reported an error while running earlier work: {text}",
            state.name
        )))
    }

    fn registry() -> &'static Mutex<Vec<(usize, CubeDevice<Self>)>> {
        static DEVICES: Mutex<Vec<(usize, CubeDevice<WgpuRuntime>)>> = Mutex::new(Vec::new());
        &DEVICES
    }
}

/// The size of the adapter's largest device-local memory heap, where the adapter is a
/// Vulkan one (`None` elsewhere: wgpu does not say how much memory an adapter has).
#[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
fn largest_device_heap(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: the hal adapter is only read (its physical device's memory properties),
    // while `adapter` keeps it alive.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance.
    let memory =
        unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    memory
        .memory_heaps_as_slice()
        .iter()
        .filter(|heap| heap.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|heap| heap.size)
        .max()
}

/// Without Vulkan there is no portable way to ask an adapter's memory.
#[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
fn largest_device_heap(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

/// CubeCL's options, whose launches per submission `CUBECL_WGPU_MAX_TASKS` may set:
/// CubeCL panics on a value that is not a whole number, so it is checked here first and
/// refused in one line naming the variable.
fn runtime_options() -> Result<RuntimeOptions> {
    const VAR: &str = "CUBECL_WGPU_MAX_TASKS";
    if let Some(text) = std::env::var_os(VAR) {
        let text = text.to_string_lossy();
        if !matches!(text.parse::<usize>(), Ok(n) if n >= 1) {
            return Err(Error::invalid(
                VAR,
                format!(
                    "{text:?} is not a number of launches per submission: give a whole \
                     number of at least 1 (CubeCL's default is 32), or unset it"
                ),
            ));
        }
    }
    Ok(RuntimeOptions::default())
}
