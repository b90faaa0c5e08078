//! Compiled kernels, made on first use and kept for the life of the context.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cachalot_shaders::wgsl::{self, MatmulTile, Module};

use crate::error::KernelError;
use crate::waiting::{lock, scoped};

/// Which compute pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PipelineKey {
    /// The matrix product with a tile shape and its pipeline-overridable constants.
    Matmul { tile: MatmulTile, trans_a: bool, trans_b: bool, bias: bool, vec: bool },
    /// An entry point of one of the modules that start with `common.wgsl`.
    Entry { module: Module, entry: &'static str },
}

impl PipelineKey {
    /// Storage bindings before the uniform.
    pub(crate) fn storage_bindings(&self) -> u32 {
        match self {
            PipelineKey::Matmul { .. } => 4,
            PipelineKey::Entry { module, .. } => module.storage_bindings(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ModuleKey {
    Matmul(MatmulTile),
    Common(Module),
}

/// A pipeline and the layout of its one bind group.
#[derive(Debug)]
pub(crate) struct Kernel {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

#[derive(Debug, Default)]
pub(crate) struct Pipelines {
    layouts: Mutex<HashMap<u32, (wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
    modules: Mutex<HashMap<ModuleKey, wgpu::ShaderModule>>,
    kernels: Mutex<HashMap<PipelineKey, Arc<Kernel>>>,
}

impl Pipelines {
    /// The pipeline for `key` on `device`, compiled now if this is its first use; with
    /// `runtime_checks`, its shader keeps naga's bounds checks (`WgpuConfig::runtime_checks`).
    pub(crate) fn kernel(
        &self,
        device: &wgpu::Device,
        runtime_checks: bool,
        key: PipelineKey,
    ) -> Result<Arc<Kernel>, KernelError> {
        if let Some(kernel) = lock(&self.kernels).get(&key) {
            return Ok(Arc::clone(kernel));
        }
        let (kernel, error) =
            scoped(device, wgpu::ErrorFilter::Validation, || self.build_kernel(device, runtime_checks, key));
        if let Some(error) = error {
            return Err(KernelError::Wgpu(format!("compiling {key:?}: {error}")));
        }
        tracing::debug!(?key, "compiled a cachalot kernel");
        let kernel = Arc::new(kernel);
        lock(&self.kernels).insert(key, Arc::clone(&kernel));
        Ok(kernel)
    }

    fn build_kernel(&self, device: &wgpu::Device, runtime_checks: bool, key: PipelineKey) -> Kernel {
        let (bind_group_layout, pipeline_layout) = self.layout(device, key.storage_bindings());
        let (module_key, entry) = match key {
            PipelineKey::Matmul { tile, .. } => (ModuleKey::Matmul(tile), "main"),
            PipelineKey::Entry { module, entry } => (ModuleKey::Common(module), entry),
        };
        let module = self.module(device, runtime_checks, module_key);
        let constants: Vec<(&str, f64)> = match key {
            PipelineKey::Matmul { trans_a, trans_b, bias, vec, .. } => vec![
                ("TRANS_A", f64::from(u8::from(trans_a))),
                ("TRANS_B", f64::from(u8::from(trans_b))),
                ("HAS_BIAS", f64::from(u8::from(bias))),
                ("VEC", f64::from(u8::from(vec))),
            ],
            PipelineKey::Entry { .. } => Vec::new(),
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        Kernel { pipeline, layout: bind_group_layout }
    }

    /// The bind group layout of `storage` read_write storage buffers followed by one uniform.
    fn layout(&self, device: &wgpu::Device, storage: u32) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut layouts = lock(&self.layouts);
        let entry = layouts.entry(storage).or_insert_with(|| {
            let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..storage)
                .map(|binding| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: storage,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
            let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("cachalot kernel"),
                entries: &entries,
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("cachalot kernel"),
                bind_group_layouts: &[Some(&bind_group_layout)],
                immediate_size: 0,
            });
            (bind_group_layout, pipeline_layout)
        });
        entry.clone()
    }

    fn module(&self, device: &wgpu::Device, runtime_checks: bool, key: ModuleKey) -> wgpu::ShaderModule {
        let mut modules = lock(&self.modules);
        modules
            .entry(key)
            .or_insert_with(|| {
                let source = match key {
                    ModuleKey::Matmul(tile) => tile.source(),
                    ModuleKey::Common(module) => wgsl::module_source(module),
                };
                let descriptor = wgpu::ShaderModuleDescriptor {
                    label: Some("cachalot kernels"),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                };
                if runtime_checks {
                    device.create_shader_module(descriptor)
                } else {
                    // SAFETY: every kernel in `cachalot-shaders` guards its storage accesses
                    // with explicit bounds tests, indexes workgroup and private arrays only
                    // with values below their constant lengths, and has loops bounded by
                    // uniform parameters; the runner checks every binding against the
                    // shape before dispatching. naga's checks would repeat those tests.
                    unsafe { device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked()) }
                }
            })
            .clone()
    }
}
