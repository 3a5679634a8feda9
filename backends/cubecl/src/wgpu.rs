//! The wgpu runtime (Vulkan on Linux, Metal, DX12) through CubeCL's WGSL compiler.
//!
//! Adapters are picked here rather than by CubeCL's default device, which skips
//! software adapters: hardware adapters come first, then software ones, so Mesa's
//! lavapipe (a CPU Vulkan driver) serves CI machines without a GPU. The WGSL path is
//! used because CubeCL's SPIR-V path crashed lavapipe (Mesa 22.3) while building a
//! matmul pipeline. wgpu has no f64, bf16 or (portably) f16 in compute shaders, so
//! this runtime holds f32, i32, u32 and bool.

use crate::device::{CubeDevice, KilnRuntime, Opened};
use cubecl::wgpu::{init_device, RuntimeOptions, WgpuRuntime, WgpuSetup};
use kiln_tensor::{DType, Error, Result};
use std::sync::Mutex;

/// What to install when no adapter is found.
pub const INSTALL_HINT: &str = "install a Vulkan driver: on Debian/Ubuntu `apt-get install \
     mesa-vulkan-drivers` gives Mesa's lavapipe (a CPU Vulkan driver that needs no GPU); \
     on a GPU machine, the vendor's driver with its Vulkan ICD (for NVIDIA, point \
     VK_DRIVER_FILES at nvidia_icd.json); the Vulkan loader is the libvulkan1 package";

impl KilnRuntime for WgpuRuntime {
    const NAME: &'static str = "wgpu";
    type Extra = ();

    fn open(ordinal: usize) -> Result<Opened<Self>> {
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
        let backend = info.backend;
        let setup = WgpuSetup {
            instance,
            adapter,
            device,
            queue,
            backend,
        };
        let cube_device = init_device(setup, RuntimeOptions::default());
        let max_buffer_bytes =
            (limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        Ok(Opened {
            device: cube_device,
            name: format!(
                "{} ({:?}, {:?}, driver {} {})",
                info.name, info.backend, info.device_type, info.driver, info.driver_info
            ),
            max_buffer_bytes,
            dtypes: vec![DType::F32, DType::I32, DType::U32, DType::Bool],
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
            // wgpu does not say how much memory an adapter has.
            default_memory_limit: None,
            extra: (),
        })
    }

    fn registry() -> &'static Mutex<Vec<(usize, CubeDevice<Self>)>> {
        static DEVICES: Mutex<Vec<(usize, CubeDevice<WgpuRuntime>)>> = Mutex::new(Vec::new());
        &DEVICES
    }
}
