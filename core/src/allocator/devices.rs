//! Several devices in one process: one [`CachingAllocator`] per device, as PyTorch's
//! `NativeCachingAllocator` keeps one `DeviceCachingAllocator` per device. Devices share
//! nothing: each has its own pools, stats, trace and out-of-memory errors; an allocation is
//! freed on the device that made it, whichever device is current.

use super::{Allocation, CachingAllocator};
use crate::backend::{Backend, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocatorError;
use crate::stats::MemoryStats;

/// The allocators of every device, by device index.
///
/// ```
/// use cachalot_core::{AllocatorConfig, DeviceAllocators, SimBackend, StreamId};
/// let backends = [SimBackend::new(80 << 30), SimBackend::new(80 << 30)];
/// let mut devices = DeviceAllocators::new(backends, &AllocatorConfig::default())?;
/// let x = devices.malloc(1, 4 << 20, StreamId::DEFAULT)?;
/// assert_eq!(devices.device(1)?.memory_allocated(), 4 << 20);
/// assert_eq!(devices.device(0)?.memory_reserved(), 0);
/// devices.free(x)?; // on device 1, where it was made
/// devices.empty_cache()?; // every device
/// assert_eq!(devices.device(1)?.memory_reserved(), 0);
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
pub struct DeviceAllocators<B: Backend> {
    devices: Vec<CachingAllocator<B>>,
}

impl<B: Backend> DeviceAllocators<B> {
    /// One allocator per backend, device `i` over the `i`-th, all with `config`.
    pub fn new(backends: impl IntoIterator<Item = B>, config: &AllocatorConfig) -> Result<Self, AllocatorError> {
        let devices =
            backends.into_iter().map(|b| CachingAllocator::new(b, config.clone())).collect::<Result<_, _>>()?;
        Ok(DeviceAllocators { devices })
    }

    /// The registry of allocators made elsewhere (e.g. by the replays of a multi-device trace),
    /// device `i` being the `i`-th.
    pub fn from_allocators(allocators: Vec<CachingAllocator<B>>) -> Self {
        DeviceAllocators { devices: allocators }
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there is no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Device `index`'s allocator.
    pub fn device(&self, index: usize) -> Result<&CachingAllocator<B>, AllocatorError> {
        let available = self.devices.len();
        self.devices.get(index).ok_or(AllocatorError::NoDevice { device: index, available })
    }

    /// Device `index`'s allocator, mutably.
    pub fn device_mut(&mut self, index: usize) -> Result<&mut CachingAllocator<B>, AllocatorError> {
        let available = self.devices.len();
        self.devices.get_mut(index).ok_or(AllocatorError::NoDevice { device: index, available })
    }

    /// Every device's allocator, by index.
    pub fn iter(&self) -> impl Iterator<Item = &CachingAllocator<B>> {
        self.devices.iter()
    }

    /// `malloc` on device `device`.
    pub fn malloc(&mut self, device: usize, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError> {
        self.device_mut(device)?.malloc(size, stream)
    }

    /// Frees `allocation` on the device that made it; an allocation of no device here is an
    /// error, as a foreign one is for one allocator.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError> {
        match self.devices.iter_mut().find(|d| d.id == allocation.allocator) {
            Some(device) => device.free(allocation),
            None => Err(crate::error::HandleError::Foreign { address: allocation.address }.into()),
        }
    }

    /// `torch.cuda.empty_cache()` on every device, in index order (PyTorch's `emptyCache` loops
    /// over all device allocators); stops at the first device that fails.
    pub fn empty_cache(&mut self) -> Result<(), AllocatorError> {
        self.devices.iter_mut().try_for_each(CachingAllocator::empty_cache)
    }

    /// `memory_stats(device)` of every device, by index.
    pub fn stats(&self) -> Vec<MemoryStats> {
        self.devices.iter().map(CachingAllocator::stats).collect()
    }

    /// The allocators, by device index.
    pub fn into_allocators(self) -> Vec<CachingAllocator<B>> {
        self.devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimBackend;

    fn two_devices() -> DeviceAllocators<SimBackend> {
        let backends = [SimBackend::new(1 << 30), SimBackend::new(1 << 30)];
        DeviceAllocators::new(backends, &AllocatorConfig::default()).unwrap()
    }

    #[test]
    fn devices_keep_separate_pools_and_stats() {
        let mut devices = two_devices();
        let a = devices.malloc(0, 3 << 20, StreamId::DEFAULT).unwrap();
        devices.free(a).unwrap();
        // Device 1 does not see device 0's cached 20 MiB segment.
        let b = devices.malloc(1, 3 << 20, StreamId::DEFAULT).unwrap();
        let stats = devices.stats();
        assert_eq!((stats[0].memory_allocated(), stats[0].memory_reserved()), (0, 20 << 20));
        assert_eq!((stats[1].memory_allocated(), stats[1].memory_reserved()), (3 << 20, 20 << 20));
        assert_eq!(stats[1].num_device_alloc, 1);
        devices.free(b).unwrap();
        devices.empty_cache().unwrap();
        assert!(devices.iter().all(|d| d.memory_reserved() == 0));
        for d in devices.iter() {
            d.check_consistency().unwrap();
        }
    }

    #[test]
    fn a_device_out_of_range_or_a_foreign_allocation_is_an_error() {
        let mut devices = two_devices();
        let error = devices.malloc(2, 512, StreamId::DEFAULT).unwrap_err();
        assert_eq!(error.to_string(), "no device 2: there are 2 devices (0 to 1)");
        let mut other = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        let foreign = other.malloc(512, StreamId::DEFAULT).unwrap();
        assert!(matches!(devices.free(foreign), Err(AllocatorError::InvalidHandle(_))));
        assert!(devices.device(0).unwrap().stats().num_device_alloc == 0);
    }
}
