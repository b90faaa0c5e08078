//! Operands: device byte ranges, and their bridge to cudarc's safe copy and cuBLAS calls.

use std::marker::PhantomData;
use std::sync::Arc;

use cachalot_core::Allocation;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys::CUdeviceptr};

use crate::error::CudaError;

/// A range of device memory a kernel reads or writes: a `CUdeviceptr` and the bytes behind it.
///
/// Every kernel takes its operands as `impl Into<DeviceSpan>`, so an `&Allocation` works
/// directly (the bytes it asked for: the block's rounding slack is not counted), and a runtime
/// can pass views into it with [`DeviceSpan::slice`] or the whole block with
/// [`DeviceSpan::block`]. Kernels check that each operand holds the elements they touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceSpan {
    /// Device address of the first byte.
    pub address: u64,
    /// Bytes available from `address`.
    pub bytes: u64,
}

impl DeviceSpan {
    /// The range `[address, address + bytes)`.
    pub fn new(address: u64, bytes: u64) -> Self {
        DeviceSpan { address, bytes }
    }

    /// The sub-range `[offset, offset + bytes)` of this one.
    pub fn slice(self, offset: u64, bytes: u64) -> Result<DeviceSpan, CudaError> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(DeviceSpan { address: self.address + offset, bytes }),
            _ => Err(CudaError::InvalidArguments(format!(
                "[{offset}, +{bytes}) is outside a span of {} bytes",
                self.bytes
            ))),
        }
    }

    /// The address, after checking that `needed` bytes fit; `what` names the operand in errors.
    pub(crate) fn check(self, what: &str, needed: u64) -> Result<u64, CudaError> {
        if needed > self.bytes {
            return Err(CudaError::InvalidArguments(format!(
                "operand {what} holds {} bytes but {needed} are needed",
                self.bytes
            )));
        }
        if needed > 0 && self.address == 0 {
            return Err(CudaError::InvalidArguments(format!("operand {what} is a null pointer")));
        }
        Ok(self.address)
    }
}

impl DeviceSpan {
    /// The whole block of an allocation, rounding slack included.
    pub fn block(allocation: &Allocation) -> Self {
        DeviceSpan { address: allocation.address(), bytes: allocation.size() }
    }
}

impl From<&Allocation> for DeviceSpan {
    /// The bytes the allocation asked for.
    fn from(allocation: &Allocation) -> Self {
        DeviceSpan { address: allocation.address(), bytes: allocation.requested_size() }
    }
}

impl From<&DeviceSpan> for DeviceSpan {
    fn from(span: &DeviceSpan) -> Self {
        *span
    }
}

/// A device range seen as cudarc's `[T]` on a stream, so the safe copy and cuBLAS calls take
/// allocator memory. It owns nothing, and records no events: the caching allocator orders
/// streams (events at free time), as PyTorch does.
pub(crate) struct Region<'a, T> {
    pointer: CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    marker: PhantomData<T>,
}

impl<'a, T> Region<'a, T> {
    /// `len` elements of `T` at `pointer`; the caller checked the span.
    pub(crate) fn new(pointer: CUdeviceptr, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        Region { pointer, len, stream, marker: PhantomData }
    }
}

impl<T> DeviceSlice<T> for Region<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for Region<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.pointer, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Region<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.pointer, SyncOnDrop::Record(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_inside_and_checks_name_the_operand() {
        let span = DeviceSpan::new(0x1000, 4096);
        assert_eq!(span.slice(512, 1024).unwrap(), DeviceSpan::new(0x1200, 1024));
        assert!(span.slice(4000, 200).is_err());
        assert!(span.slice(u64::MAX, 2).is_err());
        assert_eq!(span.check("x", 4096).unwrap(), 0x1000);
        let err = span.check("weight", 4100).unwrap_err().to_string();
        assert!(err.contains("weight") && err.contains("4100"), "{err}");
        assert!(DeviceSpan::new(0, 0).check("empty", 0).is_ok());
        assert!(DeviceSpan::new(0, 8).check("null", 4).is_err());
    }
}
