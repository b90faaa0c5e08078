//! The driver's virtual memory management API (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`), which
//! cudarc's safe layer does not wrap. Every raw VMM call of the crate is in this module.
//!
//! The shape follows PyTorch's `ExpandableSegment`: one reservation of VA per (stream, pool),
//! physical memory created and mapped one page at a time (a page is 2 MiB in the small pool,
//! `large_segment_size` in the large one), access granted on the whole mapped range, and
//! pages unmapped and released one by one after the segment's stream was synchronized.

use std::collections::BTreeMap;

use cachalot_core::BackendError;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};

use crate::error::backend_error;

/// A VA reservation and the pages mapped in it.
#[derive(Debug)]
struct Reservation {
    size: u64,
    page_size: u64,
    /// Physical allocation of each mapped page, by offset from the base.
    pages: BTreeMap<u64, CUmemGenericAllocationHandle>,
}

/// The reservations of one device. The caller keeps the device's context current.
#[derive(Debug)]
pub(crate) struct VirtualMemory {
    ordinal: i32,
    granularity: u64,
    reservations: BTreeMap<CUdeviceptr, Reservation>,
    mapped_bytes: u64,
    /// Bases of all reservations ever made, in order (tests plan a simulator with them).
    history: Vec<u64>,
}

fn check(call: &'static str, result: sys::CUresult) -> Result<(), BackendError> {
    result.result().map_err(|e| backend_error(call, e))
}

impl VirtualMemory {
    /// VMM state of device `ordinal`, whose minimum mapping granularity is queried here.
    pub(crate) fn new(ordinal: i32) -> Result<Self, BackendError> {
        let prop = allocation_prop(ordinal);
        let mut granularity = 0usize;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(VirtualMemory {
            ordinal,
            granularity: (granularity as u64).max(1),
            reservations: BTreeMap::new(),
            mapped_bytes: 0,
            history: Vec::new(),
        })
    }

    /// The device's minimum mapping granularity (2 MiB on current GPUs).
    pub(crate) fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Bytes of physical memory mapped in all reservations.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }

    /// Bases of all reservations made so far, in order.
    pub(crate) fn history(&self) -> &[u64] {
        &self.history
    }

    /// Live reservations as `(base, size, mapped bytes)`.
    pub(crate) fn reservations(&self) -> Vec<(u64, u64, u64)> {
        self.reservations.iter().map(|(&b, r)| (b, r.size, r.pages.len() as u64 * r.page_size)).collect()
    }

    /// `cuMemAddressReserve` of `size` bytes to be mapped in pages of `page_size`.
    pub(crate) fn reserve(&mut self, size: u64, page_size: u64) -> Result<u64, BackendError> {
        if page_size == 0 || !page_size.is_multiple_of(self.granularity) || !size.is_multiple_of(page_size) {
            return Err(BackendError::Device(format!(
                "expandable segment pages of {page_size} bytes (reservation {size}) are not multiples of the \
                 device's mapping granularity of {} bytes",
                self.granularity
            )));
        }
        let mut base: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; alignment 0 means the granularity, address 0 means anywhere.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut base, size as usize, 0, 0, 0) })?;
        self.reservations.insert(base, Reservation { size, page_size, pages: BTreeMap::new() });
        self.history.push(base);
        Ok(base)
    }

    /// Backs `[base + offset, base + offset + size)` with fresh pages and grants the device
    /// read/write access. All or nothing: if a page cannot be created or mapped, the pages of
    /// this call are unmapped and released again before the error is returned.
    pub(crate) fn map(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        let ordinal = self.ordinal;
        let reservation = self
            .reservations
            .get_mut(&base)
            .ok_or_else(|| BackendError::Device(format!("map in unknown reservation {base:#x}")))?;
        let page = reservation.page_size;
        if !offset.is_multiple_of(page) || !size.is_multiple_of(page) || size == 0 || offset + size > reservation.size {
            return Err(BackendError::Device(format!(
                "map of [{offset:#x}, +{size:#x}) is not whole pages of reservation {base:#x}"
            )));
        }
        let offsets: Vec<u64> = (offset..offset + size).step_by(page as usize).collect();
        if offsets.iter().any(|o| reservation.pages.contains_key(o)) {
            return Err(BackendError::Device(format!("map of an already mapped page in {base:#x}")));
        }
        let prop = allocation_prop(ordinal);
        let mut done: Vec<(u64, CUmemGenericAllocationHandle)> = Vec::with_capacity(offsets.len());
        let mut failure = None;
        for &o in &offsets {
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and property struct.
            if let Err(e) = check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, page as usize, &prop, 0) }) {
                failure = Some(e);
                break;
            }
            // SAFETY: the range is inside our reservation and not mapped (checked above).
            if let Err(e) = check("cuMemMap", unsafe { sys::cuMemMap(base + o, page as usize, 0, handle, 0) }) {
                // SAFETY: the handle was just created and is mapped nowhere.
                let _ = unsafe { sys::cuMemRelease(handle) };
                failure = Some(e);
                break;
            }
            done.push((o, handle));
        }
        if failure.is_none() {
            let access = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: ordinal,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the whole range was mapped just above.
            failure =
                check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(base + offset, size as usize, &access, 1) }).err();
        }
        if let Some(error) = failure {
            // Roll back: nothing of this call stays mapped (PyTorch does the same on OOM).
            for (o, handle) in done {
                // SAFETY: mapped and created above by this call.
                unsafe {
                    let _ = sys::cuMemUnmap(base + o, page as usize);
                    let _ = sys::cuMemRelease(handle);
                }
            }
            return Err(error);
        }
        reservation.pages.extend(done);
        self.mapped_bytes += size;
        Ok(())
    }

    /// Unmaps and releases the pages of `[base + offset, +size)`. The caller has synchronized
    /// the stream that used them.
    pub(crate) fn unmap(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        let reservation = self
            .reservations
            .get_mut(&base)
            .ok_or_else(|| BackendError::Device(format!("unmap in unknown reservation {base:#x}")))?;
        let page = reservation.page_size;
        let offsets: Vec<u64> = (offset..offset.saturating_add(size)).step_by(page as usize).collect();
        if !offset.is_multiple_of(page)
            || !size.is_multiple_of(page)
            || offsets.iter().any(|o| !reservation.pages.contains_key(o))
        {
            return Err(BackendError::Device(format!("unmap of pages that are not mapped in {base:#x}")));
        }
        let mut first_error = None;
        for o in offsets {
            if let Some(handle) = reservation.pages.remove(&o) {
                // SAFETY: the page is mapped at this address with this handle (tracked above).
                let unmapped = check("cuMemUnmap", unsafe { sys::cuMemUnmap(base + o, page as usize) });
                // SAFETY: as above; a released handle is no longer tracked.
                let released = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) });
                self.mapped_bytes -= page;
                first_error = first_error.or(unmapped.err()).or(released.err());
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `cuMemAddressFree` of a reservation with nothing mapped in it.
    pub(crate) fn release(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        match self.reservations.get(&base) {
            Some(r) if r.size == size && r.pages.is_empty() => {
                // SAFETY: a reservation of ours with no mappings.
                check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(base, size as usize) })?;
                self.reservations.remove(&base);
                Ok(())
            }
            Some(_) => Err(BackendError::Device(format!(
                "release of reservation {base:#x} that still has pages mapped or another size"
            ))),
            None => Err(BackendError::Device(format!("release of unknown reservation {base:#x}"))),
        }
    }

    /// Unmaps, releases and frees everything (the backend is going away; the device was
    /// synchronized). Errors are ignored: there is no one left to tell.
    pub(crate) fn release_all(&mut self) {
        for (base, reservation) in std::mem::take(&mut self.reservations) {
            for (o, handle) in reservation.pages {
                // SAFETY: our mappings and handles, unused after the synchronization.
                unsafe {
                    let _ = sys::cuMemUnmap(base + o, reservation.page_size as usize);
                    let _ = sys::cuMemRelease(handle);
                }
            }
            // SAFETY: our reservation, now empty.
            let _ = unsafe { sys::cuMemAddressFree(base, reservation.size as usize) };
        }
        self.mapped_bytes = 0;
    }
}

/// Pinned device memory on device `ordinal`, no shareable handle (PyTorch's default).
fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}
