//! # cachalot-wgpu
//!
//! The wgpu backend of cachalot (issue 5, not built yet): segments will be `wgpu::Buffer`s and
//! blocks ranges of them, so the same allocator policy runs on Vulkan, Metal, DX12 and WebGPU.
//! Today this crate holds nothing that runs.
