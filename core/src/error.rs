//! Errors of the allocator API and PyTorch's out-of-memory message.

use crate::backend::BackendError;
use crate::config::ConfigError;
use crate::pool::PoolId;

pub use crate::text::{QUOTED_BYTES, group_digits, shorten};

/// Why an allocator call failed. After any error the allocator is consistent and usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocatorError {
    /// No memory for the request, after the whole retry chain (PyTorch's `OutOfMemoryError`).
    #[error("{}", .0.message)]
    OutOfMemory(Box<OutOfMemoryError>),
    /// A handle that is not a live allocation of this allocator.
    #[error(transparent)]
    InvalidHandle(#[from] HandleError),
    /// The device failed for a reason other than memory.
    #[error("device error: {0}")]
    Backend(#[from] BackendError),
    /// The configuration cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configuration asks for something this backend cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// A private-pool call that does not fit the pools' state.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A device index beyond the devices there are.
    #[error("no device {device}: there are {available} devices (0 to {})", .available.saturating_sub(1))]
    NoDevice {
        /// The index asked for.
        device: usize,
        /// How many devices there are.
        available: usize,
    },
}

/// A handle that cannot be freed or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// The handle was made by another allocator.
    #[error("the allocation at {address:#x} belongs to another allocator")]
    Foreign {
        /// The address the handle names.
        address: u64,
    },
    /// The block behind the handle was freed and has since been merged or handed out again.
    #[error("the allocation at {address:#x} is stale: it was freed and its block reused")]
    Stale {
        /// The address the handle names.
        address: u64,
    },
    /// The allocation was already freed.
    #[error("double free of the allocation at {address:#x}")]
    DoubleFree {
        /// The address the handle names.
        address: u64,
    },
}

/// The details of an out-of-memory error, with PyTorch 2.11's exact message.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemoryError {
    /// The full message, as PyTorch words it.
    pub message: String,
    /// Bytes requested by the caller.
    pub requested: u64,
    /// The request rounded to a block size.
    pub rounded: u64,
    /// The segment size that could not be obtained ("Tried to allocate").
    pub allocation_size: u64,
    /// Device free memory at the error (driver-dependent).
    pub device_free: u64,
    /// Device total memory.
    pub device_total: u64,
    /// The memory-fraction allowance, if one is set.
    pub allowed: Option<u64>,
    /// `memory_allocated()` at the error.
    pub allocated: u64,
    /// `memory_reserved()` at the error.
    pub reserved: u64,
    /// A device limit that refused the request, if the backend named one.
    pub limit: Option<String>,
}

/// How the line begins that cachalot's PyTorch plug-in appends to PyTorch's out-of-memory
/// message (the error's main cause); [`OutOfMemoryError::allocator_part`] leaves it out, as
/// PyTorch's allocator writes no such line.
pub const OOM_CAUSE_LINE: &str = "\ncachalot: ";

impl OutOfMemoryError {
    /// The part of the message the allocator decides: everything but the device's free memory
    /// and the per-process sentence, which come from the driver and NVML, and cachalot's line
    /// ([`OOM_CAUSE_LINE`]).
    pub fn allocator_part(message: &str) -> String {
        let message = message.split(OOM_CAUSE_LINE).next().unwrap_or(message);
        // "... GPU 0 has a total capacity of X of which Y is free. [proc] [allowed; ]Of the ..."
        let Some(start) = message.find(" of which ") else { return message.to_owned() };
        let Some(rest) = message[start..].find("Of the allocated memory") else { return message.to_owned() };
        let middle = &message[start..start + rest];
        let allowed = middle.find(" allowed; ").map(|end| {
            let from = middle[..end].rfind(". ").map(|i| i + 2).unwrap_or(0);
            &middle[from..end + " allowed; ".len()]
        });
        format!("{} {}{}", &message[..start], allowed.unwrap_or(""), &message[start + rest..])
    }
}

/// C++ `format_size` of the allocator: bytes up to 1 KiB, then KiB/MiB/GiB with two decimals.
pub fn format_size(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", bytes as f64 / 1024.0)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / 1048576.0)
    } else {
        format!("{:.2} GiB", bytes as f64 / 1073741824.0)
    }
}

/// The pieces of PyTorch's out-of-memory message.
pub(crate) struct OomText<'a> {
    pub allocation_size: u64,
    pub device: u32,
    pub device_total: u64,
    pub device_free: u64,
    pub process_text: &'a str,
    pub allowed: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    /// Bytes of free blocks in private pools, which PyTorch counts as allocated.
    pub in_private_pools: u64,
    pub limit: Option<&'a str>,
}

impl OomText<'_> {
    pub(crate) fn render(&self) -> String {
        let allowed = self.allowed.map(|a| format!("{} allowed; ", format_size(a))).unwrap_or_default();
        let private = match self.in_private_pools {
            0 => String::new(),
            bytes => format!("with {} allocated in private pools (e.g., CUDA Graphs), ", format_size(bytes)),
        };
        let mut message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. \
             {}{}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation.  See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(self.allocation_size),
            self.device,
            format_size(self.device_total),
            format_size(self.device_free),
            self.process_text,
            allowed,
            format_size(self.allocated + self.in_private_pools),
            private,
            format_size(self.reserved.saturating_sub(self.allocated + self.in_private_pools)),
        );
        if let Some(limit) = self.limit {
            message.push_str(&format!(" Device limit: {limit}."));
        }
        message
    }
}

/// A misuse of the private-pool calls; the allocator is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// `(0, 0)` names the default pools, which cannot be created, routed to or released.
    #[error("pool (0, 0) is the default pools, not a private pool")]
    Default,
    /// No private pool of that id exists (never created, or released and dropped).
    #[error("no private pool {0} exists")]
    Unknown(PoolId),
    /// Allocations are already routed to the pool.
    #[error("allocations are already routed to pool {0} (beginAllocateToPool: already recording to mempool_id)")]
    AlreadyRouting(PoolId),
    /// Allocations are not routed to the pool.
    #[error("allocations are not routed to pool {0} (endAllocateToPool: not currently recording to mempool_id)")]
    NotRouting(PoolId),
    /// Every user of the pool already released it.
    #[error("pool {0} was already released by every user")]
    AlreadyReleased(PoolId),
    /// A checkpoint of the pool cannot be taken or restored (CUDA-graph trees'
    /// `getCheckpointState` / `setCheckpointPoolState`).
    #[error("checkpoint of pool {pool}: {reason}")]
    Checkpoint {
        /// The pool.
        pool: PoolId,
        /// What does not fit, in words.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn digits_are_grouped_in_threes() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (3_000_434, "3,000,434"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ] {
            assert_eq!(group_digits(n), text);
        }
    }

    #[test]
    fn sizes_are_formatted_like_the_cpp_allocator() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(1024 * GIB), "1024.00 GiB");
        assert_eq!(format_size(150_109_880_320), "139.80 GiB");
    }

    /// `docs/allocator-rules.md` §10: the two measured 2.11 messages, rebuilt from their parts.
    #[test]
    fn messages_match_pytorch_2_11() {
        let process = "Including non-PyTorch memory, this process has 544.00 MiB memory in use. ";
        let free = 149_527_838_720; // prints as 139.26 GiB
        assert_eq!(format_size(free), "139.26 GiB");
        let plain = OomText {
            allocation_size: 1024 * GIB,
            device: 0,
            device_total: 150_109_880_320,
            device_free: free,
            process_text: process,
            allowed: None,
            allocated: 26 * MIB,
            reserved: 26 * MIB,
            in_private_pools: 0,
            limit: None,
        };
        assert_eq!(
            plain.render(),
            "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.26 GiB is free. Including non-PyTorch memory, this process has 544.00 MiB memory in use. Of the allocated memory 26.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        );
        let fraction = OomText { allocation_size: 2 * GIB, allowed: Some(1_503_238_554), ..plain };
        let text = fraction.render();
        assert_eq!(
            text,
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.26 GiB is free. Including non-PyTorch memory, this process has 544.00 MiB memory in use. 1.40 GiB allowed; Of the allocated memory 26.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        );
        let part = OutOfMemoryError::allocator_part(&text);
        assert!(part.starts_with("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB 1.40 GiB allowed; Of the allocated memory 26.00 MiB"), "{part}");
        assert!(!part.contains("139.26"));
        assert!(!part.contains("544.00"));
    }
}
