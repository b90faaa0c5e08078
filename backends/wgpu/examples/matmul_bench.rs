//! Throughput of the WGSL matmul on the first wgpu adapter, in GFLOP/s.
//!
//! ```text
//! cargo run --release -p cachalot-wgpu --example matmul_bench -- [SIZE...] [--iters N]
//!     [--tiles auto,128x128x8,64x64x8] [--checks off|on|both] [--layout nn|nt|tn]
//! ```
//!
//! Sizes default to 1024 2048 4096 8192 (square `n³` products; on lavapipe use small ones,
//! e.g. 256 512). Each product runs once to warm up, then `--iters` times in one submission,
//! three times over; the best of the three is reported, timed from the submit of the
//! already-encoded command buffer to the end of its wait. 32 sampled outputs are checked
//! against f64 dot products (error relative to Σ|a·b| of the entry). `--checks` compares
//! naga's run-time bounds checks off (the default) and on. Compare with cuBLAS SGEMM on the
//! same GPU in the same command with `benches/cublas_sgemm.py`.

use std::error::Error;
use std::time::Instant;

use cachalot_core::StreamId;
use cachalot_shaders::MatmulShape;
use cachalot_shaders::cpu::Rng;
use cachalot_shaders::ops::Matmul;
use cachalot_shaders::wgsl::MatmulTile;
use cachalot_wgpu::{Kernels, WgpuConfig, WgpuContext};

struct Options {
    sizes: Vec<u32>,
    iters: Option<u32>,
    tiles: Vec<Option<MatmulTile>>,
    checks: Vec<bool>,
    layout: (bool, bool),
}

fn parse_tile(text: &str) -> Result<Option<MatmulTile>, Box<dyn Error>> {
    if text == "auto" {
        return Ok(None);
    }
    let parts: Vec<u32> = text.split('x').map(str::parse).collect::<Result<_, _>>()?;
    let [bm, bn, bk] = parts[..] else { return Err(format!("tile {text}: want BMxBNxBK").into()) };
    let tile = MatmulTile { bm, bn, bk };
    if !tile.is_valid() {
        return Err(format!("tile {text}: BM and BN must be multiples of 16, BK of 4").into());
    }
    Ok(Some(tile))
}

fn parse() -> Result<Options, Box<dyn Error>> {
    let mut options =
        Options { sizes: Vec::new(), iters: None, tiles: vec![None], checks: vec![false], layout: (false, false) };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--iters" => options.iters = Some(value()?.parse()?),
            "--tiles" => options.tiles = value()?.split(',').map(parse_tile).collect::<Result<_, _>>()?,
            "--checks" => {
                options.checks = match value()?.as_str() {
                    "off" => vec![false],
                    "on" => vec![true],
                    "both" => vec![false, true],
                    other => return Err(format!("--checks {other}: want off, on or both").into()),
                }
            }
            "--layout" => {
                options.layout = match value()?.as_str() {
                    "nn" => (false, false),
                    "nt" => (false, true),
                    "tn" => (true, false),
                    other => return Err(format!("--layout {other}: want nn, nt or tn").into()),
                }
            }
            "-h" | "--help" => {
                println!(
                    "matmul_bench [SIZE...] [--iters N] [--tiles auto,128x128x8,...] [--checks off|on|both] [--layout nn|nt|tn]"
                );
                std::process::exit(0);
            }
            size => options.sizes.push(size.parse().map_err(|_| format!("not a size: {size}"))?),
        }
    }
    if options.sizes.is_empty() {
        options.sizes = vec![1024, 2048, 4096, 8192];
    }
    Ok(options)
}

fn main() -> Result<(), Box<dyn Error>> {
    let options = parse()?;
    let largest = options.sizes.iter().copied().max().unwrap_or(0) as u64;
    let mut rows = Vec::new();
    for &runtime_checks in &options.checks {
        let config =
            WgpuConfig { capacity: 3 * largest * largest * 4 + (1 << 30), runtime_checks, ..WgpuConfig::default() };
        let context = WgpuContext::request_blocking(config)?;
        let info = context.adapter_info();
        println!(
            "adapter: {} ({:?}, {:?}), driver {} {}; max_storage_buffer_binding_size {}; runtime checks {}",
            info.name,
            info.backend,
            info.device_type,
            info.driver,
            info.driver_info,
            context.limits().max_storage_buffer_binding_size,
            if runtime_checks { "on" } else { "off" }
        );
        let mut allocator = cachalot_wgpu::caching_allocator(&context, Default::default())?;
        let mut rng = Rng::new(0x5eed);
        for &n in &options.sizes {
            let (trans_a, trans_b) = options.layout;
            let shape = MatmulShape { m: n, n, k: n, trans_a, trans_b };
            let elements = n as usize * n as usize;
            let a_host = rng.vec(elements, -1.0, 1.0);
            let b_host = rng.vec(elements, -1.0, 1.0);
            let bytes = elements as u64 * 4;
            let a = allocator.malloc(bytes, StreamId::DEFAULT)?;
            let b = allocator.malloc(bytes, StreamId::DEFAULT)?;
            let c = allocator.malloc(bytes, StreamId::DEFAULT)?;
            let probe = Kernels::new(context.clone());
            let mut batch = probe.batch(&mut allocator);
            batch.upload_f32(&a, &a_host)?;
            batch.upload_f32(&b, &b_host)?;
            batch.submit()?;
            for &tile in &options.tiles {
                let kernels = Kernels::new(context.clone()).with_matmul_tile(tile);
                let used = kernels.matmul_tile(n, n);
                let label =
                    format!("{}x{}x{}{}", used.bm, used.bn, used.bk, if tile.is_none() { " (auto)" } else { "" });
                // Warm-up: pipeline compilation and first-touch of the buffers.
                let mut batch = kernels.batch(&mut allocator);
                if let Err(error) = batch.matmul(Matmul::new(&a, &b, &c, shape)) {
                    println!("{n:>6}  {label:<20} skipped: {error}");
                    continue;
                }
                let sample = batch.read_f32(&c, elements)?;
                let number = batch.submit()?;
                context.wait_for(number)?;
                let got = sample.wait_f32()?;
                let error = sampled_error(&a_host, &b_host, &got, shape, &mut rng);

                let flops = shape.flops();
                let iters = options.iters.unwrap_or_else(|| (4e12 / flops).ceil().clamp(3.0, 200.0) as u32);
                let mut best = f64::INFINITY;
                for _ in 0..3 {
                    let mut batch = kernels.batch(&mut allocator);
                    for _ in 0..iters {
                        batch.matmul(Matmul::new(&a, &b, &c, shape))?;
                    }
                    let encoded = batch.encode()?;
                    let start = Instant::now();
                    let number = encoded.submit()?;
                    context.wait_for(number)?;
                    best = best.min(start.elapsed().as_secs_f64() / iters as f64);
                }
                let gflops = flops / best / 1e9;
                println!(
                    "{n:>6}  {label:<20} checks {:<3}  {:>9.3} ms  {gflops:>9.1} GFLOP/s  sampled error {error:.1e}",
                    if runtime_checks { "on" } else { "off" },
                    best * 1e3
                );
                rows.push((n, label, runtime_checks, best, gflops, error));
            }
            for x in [a, b, c] {
                allocator.free(x)?;
            }
            context.wait_idle()?;
            allocator.empty_cache()?;
        }
    }
    println!("\nsize    tile                 checks        ms     GFLOP/s  max sampled error");
    for (n, label, checks, time, gflops, error) in rows {
        println!(
            "{n:>6}  {label:<20} {:<5} {:>9.3} {:>11.1}  {error:.1e}{}",
            if checks { "on" } else { "off" },
            time * 1e3,
            gflops,
            if error < 1e-4 { "" } else { "  WRONG" }
        );
    }
    Ok(())
}

/// Largest error of 32 sampled outputs, relative to Σ|a·b| of each (the scale of its rounding).
fn sampled_error(a: &[f32], b: &[f32], c: &[f32], shape: MatmulShape, rng: &mut Rng) -> f64 {
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let mut worst = 0.0f64;
    for _ in 0..32 {
        let i = rng.below(shape.m) as usize;
        let j = rng.below(shape.n) as usize;
        let (mut dot, mut scale) = (0.0f64, 0.0f64);
        for p in 0..k {
            let x = if shape.trans_a { a[p * m + i] } else { a[i * k + p] } as f64;
            let y = if shape.trans_b { b[j * k + p] } else { b[p * n + j] } as f64;
            dot += x * y;
            scale += (x * y).abs();
        }
        let got = c[i * n + j] as f64;
        worst = worst.max(if got.is_nan() { f64::INFINITY } else { (got - dot).abs() / scale.max(f64::MIN_POSITIVE) });
    }
    worst
}
