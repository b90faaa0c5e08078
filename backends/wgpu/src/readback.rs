//! Reading allocations back to the host: asynchronous everywhere, with a blocking wrapper
//! off the web.

use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use crate::context::WgpuContext;
use crate::error::KernelError;
use crate::waiting::lock;

/// How long [`Readback::wait_bytes`] waits for a mapping's callback after the device is idle.
#[cfg(not(target_arch = "wasm32"))]
const MAPPING_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a readback's mapping stands.
#[derive(Debug, Default)]
pub(crate) struct MapState {
    pub result: Option<Result<(), String>>,
    pub waker: Option<Waker>,
}

impl MapState {
    pub(crate) fn finish(state: &Mutex<MapState>, result: Result<(), String>) {
        let waker = {
            let mut state = lock(state);
            state.result = Some(result);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Bytes of an allocation on their way to the host: a copy into a mappable buffer, submitted
/// with the batch that made it.
///
/// Await [`Readback::bytes`] / [`Readback::f32`] on any platform (on the web the browser
/// completes the mapping), or call [`Readback::wait_f32`] natively to block.
#[derive(Debug)]
#[must_use = "a readback does nothing until its data is awaited"]
pub struct Readback {
    // Polled natively; the browser needs no polling.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) context: Arc<WgpuContext>,
    pub(crate) buffer: wgpu::Buffer,
    /// Bytes the caller asked for (the buffer may be longer: copies move multiples of 4).
    pub(crate) len: u64,
    pub(crate) state: Arc<Mutex<MapState>>,
    pub(crate) submission: u64,
}

impl Readback {
    /// The submission that copies the data (0 until its batch is submitted).
    pub fn submission(&self) -> u64 {
        self.submission
    }

    /// Whether the data can be taken without waiting.
    pub fn is_ready(&self) -> bool {
        lock(&self.state).result.is_some()
    }

    /// The bytes, once the copy has completed. Natively this future polls the device each
    /// time it is polled (wgpu only runs mapping callbacks inside `poll`), so it spins; use
    /// [`Readback::wait_bytes`] to block instead.
    pub async fn bytes(self) -> Result<Vec<u8>, KernelError> {
        std::future::poll_fn(|cx| {
            if let Some(result) = lock(&self.state).result.clone() {
                return Poll::Ready(result);
            }
            #[cfg(not(target_arch = "wasm32"))]
            if let Err(error) = self.context.poll() {
                return Poll::Ready(Err(error.to_string()));
            }
            let mut state = lock(&self.state);
            if let Some(result) = state.result.clone() {
                return Poll::Ready(result);
            }
            state.waker = Some(cx.waker().clone());
            // Native wgpu calls back only from `poll`, which nobody else may call: ask to be
            // polled again.
            #[cfg(not(target_arch = "wasm32"))]
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
        .map_err(KernelError::Readback)?;
        self.take()
    }

    /// The data as f32 values.
    pub async fn f32(self) -> Result<Vec<f32>, KernelError> {
        Ok(to_f32(&self.bytes().await?))
    }

    /// The data as u32 values.
    pub async fn u32(self) -> Result<Vec<u32>, KernelError> {
        Ok(to_u32(&self.bytes().await?))
    }

    /// Blocks until the bytes are on the host.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_bytes(self) -> Result<Vec<u8>, KernelError> {
        // wgpu runs a mapping's callback on whichever thread's poll first finds it ready. When
        // another thread polls the same device, our wait can return after that thread took the
        // callback and before it ran it: so poll until the result is in, yielding between tries.
        // A mapping still missing after the deadline was never started (its batch is neither
        // submitted nor dropped).
        let deadline = std::time::Instant::now() + MAPPING_DEADLINE;
        loop {
            let result = lock(&self.state).result.clone();
            if let Some(result) = result {
                result.map_err(KernelError::Readback)?;
                return self.take();
            }
            if std::time::Instant::now() >= deadline {
                return Err(KernelError::Readback(format!(
                    "the mapping did not complete within {} s of its wait (was the batch submitted?)",
                    MAPPING_DEADLINE.as_secs()
                )));
            }
            self.context
                .device()
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| KernelError::Readback(format!("wgpu wait: {e}")))?;
            std::thread::yield_now();
        }
    }

    /// Blocks until the data is on the host, as f32 values.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_f32(self) -> Result<Vec<f32>, KernelError> {
        Ok(to_f32(&self.wait_bytes()?))
    }

    /// Blocks until the data is on the host, as u32 values.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_u32(self) -> Result<Vec<u32>, KernelError> {
        Ok(to_u32(&self.wait_bytes()?))
    }

    /// Copies the mapped bytes out and unmaps.
    fn take(self) -> Result<Vec<u8>, KernelError> {
        let bytes = {
            let view = self.buffer.get_mapped_range(..).map_err(|e| KernelError::Readback(e.to_string()))?;
            view[..self.len as usize].to_vec()
        };
        self.buffer.unmap();
        self.buffer.destroy();
        Ok(bytes)
    }
}

fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn to_u32(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
