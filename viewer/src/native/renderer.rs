//! Which of eframe's renderers draws the window.
//!
//! wgpu where there is a GPU. Where wgpu finds only a software rasterizer (Mesa's lavapipe on
//! a machine without a GPU), OpenGL through eframe's glow renderer instead, which Mesa runs on
//! llvmpipe, which draws the same frames several times faster (the figures are in BENCHMARKS.md,
//! §8, "The window without a GPU"). The cost is egui-wgpu's fragment shader as
//! Mesa runs it, not Vulkan: egui-wgpu on llvmpipe's OpenGL (`WGPU_BACKEND=gl`) is as slow;
//! egui_glow's shader is a texture sample and a multiply.

use std::fmt;
use std::str::FromStr;

use eframe::wgpu;

/// What draws the window (`cachalot view --renderer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowRenderer {
    /// wgpu if it finds a GPU, else OpenGL (see the module docs), else wgpu on whatever it has.
    #[default]
    Auto,
    /// eframe's wgpu renderer (Vulkan, Metal, DX12 or OpenGL ES, as wgpu picks).
    Wgpu,
    /// eframe's OpenGL renderer (glow).
    Glow,
}

impl FromStr for WindowRenderer {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "auto" => Ok(WindowRenderer::Auto),
            "wgpu" => Ok(WindowRenderer::Wgpu),
            "glow" | "opengl" | "gl" => Ok(WindowRenderer::Glow),
            _ => Err(format!("unknown renderer {text:?}: expected auto, wgpu or glow")),
        }
    }
}

impl fmt::Display for WindowRenderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowRenderer::Auto => "auto",
            WindowRenderer::Wgpu => "wgpu",
            WindowRenderer::Glow => "glow",
        })
    }
}

/// The renderer [`WindowRenderer::Auto`] starts with, given the adapters wgpu finds (their
/// device types and names): wgpu if one of them is not a CPU, else glow, with the reason to
/// tell the user.
pub fn auto_renderer(adapters: &[(wgpu::DeviceType, String)]) -> (WindowRenderer, Option<String>) {
    if adapters.iter().any(|(kind, _)| *kind != wgpu::DeviceType::Cpu) {
        return (WindowRenderer::Wgpu, None);
    }
    let found = match adapters {
        [] => "wgpu finds no adapter".to_owned(),
        _ => {
            let names: Vec<&str> = adapters.iter().map(|(_, name)| name.as_str()).collect();
            format!("wgpu finds only a software rasterizer ({})", names.join(", "))
        }
    };
    (
        WindowRenderer::Glow,
        Some(format!("{found}: drawing the window with OpenGL, which software rasterizers run faster")),
    )
}

/// The device type and name of every adapter wgpu finds on its primary backends (Vulkan,
/// Metal, DX12; `WGPU_BACKEND` narrows them as it does for wgpu itself).
pub fn wgpu_adapters() -> Vec<(wgpu::DeviceType, String)> {
    let backends = wgpu::Backends::PRIMARY.with_env();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    pollster::block_on(instance.enumerate_adapters(backends))
        .iter()
        .map(|adapter| {
            let info = adapter.get_info();
            (info.device_type, info.name)
        })
        .collect()
}

/// Whether an OpenGL `GL_RENDERER` string names a software rasterizer (Mesa's llvmpipe,
/// softpipe and swrast, Windows' GDI Generic, Apple's software renderer).
pub fn is_software_gl(renderer: &str) -> bool {
    let renderer = renderer.to_ascii_lowercase();
    ["llvmpipe", "softpipe", "swrast", "software", "gdi generic"].iter().any(|name| renderer.contains(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_wgpu_when_there_is_a_gpu() {
        let adapters = [
            (wgpu::DeviceType::Cpu, "llvmpipe (LLVM 15.0.6, 256 bits)".to_owned()),
            (wgpu::DeviceType::DiscreteGpu, "NVIDIA H200".to_owned()),
        ];
        assert_eq!(auto_renderer(&adapters), (WindowRenderer::Wgpu, None));
        let integrated = [(wgpu::DeviceType::IntegratedGpu, "Apple M2".to_owned())];
        assert_eq!(auto_renderer(&integrated).0, WindowRenderer::Wgpu);
    }

    #[test]
    fn auto_takes_opengl_on_a_software_rasterizer_and_says_why() {
        let lavapipe = [(wgpu::DeviceType::Cpu, "llvmpipe (LLVM 15.0.6, 256 bits)".to_owned())];
        let (renderer, why) = auto_renderer(&lavapipe);
        assert_eq!(renderer, WindowRenderer::Glow);
        let why = why.expect("a reason");
        assert!(why.contains("only a software rasterizer (llvmpipe (LLVM 15.0.6, 256 bits))"), "{why}");
        let (renderer, why) = auto_renderer(&[]);
        assert_eq!(renderer, WindowRenderer::Glow);
        assert!(why.expect("a reason").starts_with("wgpu finds no adapter"));
    }

    #[test]
    fn software_gl_renderers_are_recognised() {
        assert!(is_software_gl("llvmpipe (LLVM 15.0.6, 256 bits)"));
        assert!(is_software_gl("softpipe"));
        assert!(is_software_gl("GDI Generic"));
        assert!(is_software_gl("Apple Software Renderer"));
        assert!(!is_software_gl("NVIDIA H200/PCIe/SSE2"));
        assert!(!is_software_gl("AMD Radeon Graphics (radeonsi, gfx1103_r1, LLVM 15.0.7, DRM 3.54)"));
    }

    #[test]
    fn renderer_names_parse_and_print() {
        for renderer in [WindowRenderer::Auto, WindowRenderer::Wgpu, WindowRenderer::Glow] {
            assert_eq!(renderer.to_string().parse::<WindowRenderer>(), Ok(renderer));
        }
        assert_eq!("OpenGL".parse::<WindowRenderer>(), Ok(WindowRenderer::Glow));
        let err = "vulkan".parse::<WindowRenderer>().expect_err("not a renderer");
        assert!(err.contains("\"vulkan\"") && err.contains("auto, wgpu or glow"), "{err}");
    }
}
