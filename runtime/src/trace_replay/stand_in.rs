//! Stand-in streams: the other stream of a recorded `record_stream`, for a replay that runs no
//! work on it.
//!
//! A free that PyTorch deferred waited for kernels on another stream; the recording shows when
//! they ended (the `free_completed` entry). A replay on a device runs no kernels, so a real
//! stream would be idle and the free would complete at the allocator's next call. To complete
//! it where the recording did, the replay records the free on a stand-in stream instead: an
//! event recorded there stays pending until the replay says the recorded work ended
//! ([`StandInStreams::finish`]), or until the allocator waits for it (a synchronization, as
//! `empty_cache` does, ended the recorded work too). Every other event is the device's own.
//! This is the simulator's held stream (`SimBackend::hold_stream`) on top of any backend: an
//! event layer ([`cachalot_core::EventLayer`]) over the device's events, which keeps the
//! device's segments and pages as they are.

use std::collections::HashMap;

use cachalot_core::{BackendError, EventLayer, StreamEvents, StreamId, WithEvents};

/// A backend whose stand-in streams' events complete when the replay says: the device's
/// segments and pages, with [`StandInStreams`] over its events.
pub type StandInBackend<B> = WithEvents<B, StandInStreams>;

/// Makes `device` a [`StandInBackend`], with no stand-in streams yet.
pub fn stand_in_backend<B>(device: B) -> StandInBackend<B> {
    WithEvents::new(device, StandInStreams::default())
}

/// The progress of one stand-in stream: events up to `completed` are complete.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    recorded: u64,
    completed: u64,
}

/// The stand-in streams of a replay: an [`EventLayer`] that keeps the events of a stand-in
/// stream pending until the replay says its work ended (module docs), and leaves every other
/// stream's events to the device.
#[derive(Debug, Default)]
pub struct StandInStreams {
    stand_ins: HashMap<StreamId, Progress>,
}

/// An event of [`StandInStreams`]: the device's own, or one on a stand-in stream.
#[derive(Debug)]
pub enum StandInEvent<E> {
    /// Recorded on one of the device's streams.
    Device(E),
    /// Recorded on a stand-in stream: the `sequence`-th event there.
    StandIn {
        /// The stand-in stream.
        stream: StreamId,
        /// Its number among the stream's events, from 1.
        sequence: u64,
    },
}

impl StandInStreams {
    /// Makes `stream` a stand-in stream: events recorded on it from now on stay pending until
    /// [`StandInStreams::finish`]. It must not be one of the device's streams.
    pub fn hold(&mut self, stream: StreamId) {
        self.stand_ins.entry(stream).or_default();
    }

    /// The recorded work on `stream` ended: its events so far are complete.
    pub fn finish(&mut self, stream: StreamId) {
        if let Some(progress) = self.stand_ins.get_mut(&stream) {
            progress.completed = progress.recorded;
        }
    }

    /// Whether an event of `stream` is still pending.
    pub fn is_pending(&self, stream: StreamId) -> bool {
        self.stand_ins.get(&stream).is_some_and(|p| p.completed < p.recorded)
    }
}

impl<B: StreamEvents> EventLayer<B> for StandInStreams {
    type Event = StandInEvent<B::Event>;

    fn record_event(&mut self, device: &mut B, stream: StreamId) -> Result<Self::Event, BackendError> {
        match self.stand_ins.get_mut(&stream) {
            Some(progress) => {
                progress.recorded += 1;
                Ok(StandInEvent::StandIn { stream, sequence: progress.recorded })
            }
            None => device.record_event(stream).map(StandInEvent::Device),
        }
    }

    fn query_event(&mut self, device: &mut B, event: &Self::Event) -> Result<bool, BackendError> {
        match event {
            StandInEvent::Device(event) => device.query_event(event),
            StandInEvent::StandIn { stream, sequence } => {
                Ok(self.stand_ins.get(stream).is_none_or(|p| *sequence <= p.completed))
            }
        }
    }

    fn synchronize_event(&mut self, device: &mut B, event: &Self::Event) -> Result<(), BackendError> {
        match event {
            StandInEvent::Device(event) => device.synchronize_event(event),
            // Waiting for the recorded work is the end of it.
            StandInEvent::StandIn { stream, sequence } => {
                if let Some(progress) = self.stand_ins.get_mut(stream) {
                    progress.completed = progress.completed.max(*sequence);
                }
                Ok(())
            }
        }
    }

    fn release_event(&mut self, device: &mut B, event: Self::Event) {
        if let StandInEvent::Device(event) = event {
            device.release_event(event);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};

    const STAND_IN: StreamId = StreamId(1 << 63);

    /// A block freed after use on a stand-in stream is not reused until the replay finishes
    /// that stream; then the next malloc takes it back.
    #[test]
    fn a_deferred_free_completes_when_the_stand_in_stream_finishes() {
        let backend = stand_in_backend(SimBackend::new(1 << 30));
        let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
        let a = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        let address = a.address();
        allocator.backend_mut().layer_mut().hold(STAND_IN);
        allocator.record_stream(&a, STAND_IN).unwrap();
        allocator.free(a).unwrap();
        assert!(allocator.backend().layer().is_pending(STAND_IN));
        let b = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        assert_ne!(b.address(), address, "the block was reused before the other stream's work ended");
        allocator.backend_mut().layer_mut().finish(STAND_IN);
        let c = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        assert_eq!(c.address(), address);
        allocator.free(b).unwrap();
        allocator.free(c).unwrap();
    }

    /// A synchronization (empty_cache) waits for the stand-in stream: the free completes and
    /// the segment is released, with no call to `finish`.
    #[test]
    fn a_synchronization_ends_the_stand_in_work() {
        let backend = stand_in_backend(SimBackend::new(1 << 30));
        let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
        let a = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        allocator.backend_mut().layer_mut().hold(STAND_IN);
        allocator.record_stream(&a, STAND_IN).unwrap();
        allocator.free(a).unwrap();
        allocator.empty_cache().unwrap();
        assert_eq!(allocator.memory_reserved(), 0);
        assert!(!allocator.backend().layer().is_pending(STAND_IN));
    }
}
