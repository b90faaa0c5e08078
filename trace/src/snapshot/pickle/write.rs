//! Writing: TorchSnapshot → protocol 4

use super::*;

/// Python's pickler batches `APPENDS`/`SETITEMS` by this many items.
const BATCH: usize = 1000;

/// Emits pickle opcodes, memoising strings, frame dicts and stacks so that each is written once.
pub(super) struct Writer<'s> {
    pub(super) out: Vec<u8>,
    contexts: &'s ContextTable,
    next_memo: u32,
    strings: HashMap<&'s str, u32>,
    frames: HashMap<&'s Frame, u32>,
    stacks: HashMap<ContextId, u32>,
}

impl<'s> Writer<'s> {
    pub(super) fn new(contexts: &'s ContextTable) -> Self {
        Writer {
            out: Vec::new(),
            contexts,
            next_memo: 0,
            strings: HashMap::new(),
            frames: HashMap::new(),
            stacks: HashMap::new(),
        }
    }

    fn memoize(&mut self, place: &Place<'_>) -> Result<u32, PickleError> {
        let id = self.next_memo;
        self.next_memo = id.checked_add(1).ok_or_else(|| place.unwritable("more than 2^32 shared values"))?;
        self.out.push(op::MEMOIZE);
        Ok(id)
    }

    fn get(&mut self, id: u32) {
        match u8::try_from(id) {
            Ok(id) => self.out.extend([op::BINGET, id]),
            Err(_) => {
                self.out.push(op::LONG_BINGET);
                self.out.extend(id.to_le_bytes());
            }
        }
    }

    fn string(&mut self, text: &'s str, place: &Place<'_>) -> Result<(), PickleError> {
        if let Some(&id) = self.strings.get(text) {
            self.get(id);
            return Ok(());
        }
        let bytes = text.as_bytes();
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.out.extend([op::SHORT_BINUNICODE, n]);
        } else if let Ok(n) = u32::try_from(bytes.len()) {
            self.out.push(op::BINUNICODE);
            self.out.extend(n.to_le_bytes());
        } else {
            self.out.push(op::BINUNICODE8);
            self.out.extend((bytes.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
        let id = self.memoize(place)?;
        self.strings.insert(text, id);
        Ok(())
    }

    /// An int the way Python's pickler writes it: the shortest of BININT1/BININT2/BININT/LONG1.
    pub(super) fn int(&mut self, value: i128) {
        if let Ok(v) = u8::try_from(value) {
            self.out.extend([op::BININT1, v]);
        } else if let Ok(v) = u16::try_from(value) {
            self.out.push(op::BININT2);
            self.out.extend(v.to_le_bytes());
        } else if let Ok(v) = i32::try_from(value) {
            self.out.push(op::BININT);
            self.out.extend(v.to_le_bytes());
        } else {
            // Two's complement, little-endian, without redundant sign bytes.
            let bytes = value.to_le_bytes();
            let mut n = bytes.len();
            while n > 1 {
                let (last, below) = (bytes[n - 1], bytes[n - 2]);
                if (last == 0x00 && below & 0x80 == 0) || (last == 0xff && below & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend([op::LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    /// A stream handle, as PyTorch writes it: its `cudaStream_t` cast to `int64_t`.
    fn stream(&mut self, handle: u64) {
        self.int((handle as i64).into());
    }

    fn float(&mut self, value: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend(value.to_be_bytes());
    }

    fn boolean(&mut self, value: bool) {
        self.out.push(if value { op::NEWTRUE } else { op::NEWFALSE });
    }

    fn begin_dict(&mut self) {
        self.out.extend([op::EMPTY_DICT, op::MARK]);
    }

    fn end_dict(&mut self) {
        self.out.push(op::SETITEMS);
    }

    /// The key of the next dict item.
    fn key(&mut self, name: &'static str, place: &Place<'_>) -> Result<(), PickleError> {
        self.string(name, place)
    }

    /// A list, its items written by `item`, batched like Python's pickler batches them.
    fn list<T>(
        &mut self,
        items: &'s [T],
        place: &Place<'_>,
        mut item: impl FnMut(&mut Self, &'s T, &Place<'_>) -> Result<(), PickleError>,
    ) -> Result<(), PickleError> {
        self.out.push(op::EMPTY_LIST);
        self.items(items, place, &mut item)
    }

    fn items<T>(
        &mut self,
        items: &'s [T],
        place: &Place<'_>,
        item: &mut impl FnMut(&mut Self, &'s T, &Place<'_>) -> Result<(), PickleError>,
    ) -> Result<(), PickleError> {
        for (batch_index, batch) in items.chunks(BATCH).enumerate() {
            if batch.len() > 1 {
                self.out.push(op::MARK);
            }
            for (i, value) in batch.iter().enumerate() {
                item(self, value, &place.index(batch_index * BATCH + i))?;
            }
            self.out.push(if batch.len() > 1 { op::APPENDS } else { op::APPEND });
        }
        Ok(())
    }

    fn stack(&mut self, id: ContextId, place: &Place<'_>) -> Result<(), PickleError> {
        if let Some(&memo) = self.stacks.get(&id) {
            self.get(memo);
            return Ok(());
        }
        let contexts = self.contexts;
        let Some(frames) = contexts.stacks().get(id.0 as usize) else {
            return Err(place.unwritable(format!(
                "stack {} is not in the snapshot's context table ({} stacks)",
                id.0,
                contexts.stacks().len()
            )));
        };
        self.out.push(op::EMPTY_LIST);
        let memo = self.memoize(place)?;
        self.stacks.insert(id, memo);
        self.items(frames, place, &mut |w, frame, place| w.frame(frame, place))
    }

    fn frame(&mut self, frame: &'s Frame, place: &Place<'_>) -> Result<(), PickleError> {
        if let Some(&memo) = self.frames.get(frame) {
            self.get(memo);
            return Ok(());
        }
        self.out.push(op::EMPTY_DICT);
        let memo = self.memoize(place)?;
        self.frames.insert(frame, memo);
        self.out.push(op::MARK);
        self.key("name", place)?;
        self.string(&frame.name, place)?;
        self.key("filename", place)?;
        self.string(&frame.filename, place)?;
        self.key("line", place)?;
        // PyTorch's line is a `uint64_t`; ours keeps its bits (an unknown line, 2^64 - 1, is -1).
        self.int((frame.line as u64).into());
        self.end_dict();
        Ok(())
    }

    /// The `frames` of a segment or block: PyTorch writes `[]` when none was recorded.
    fn stack_or_empty(&mut self, id: Option<ContextId>, place: &Place<'_>) -> Result<(), PickleError> {
        match id {
            Some(id) => self.stack(id, place),
            None => {
                self.out.push(op::EMPTY_LIST);
                Ok(())
            }
        }
    }

    pub(super) fn snapshot(&mut self, snapshot: &'s TorchSnapshot) -> Result<(), PickleError> {
        let place = Place::ROOT;
        self.out.extend([op::PROTO, 4]);
        self.begin_dict();
        self.key("segments", &place)?;
        let segments = place.field("segments");
        self.list(&snapshot.segments, &segments, |w, s, p| w.segment(s, p))?;
        self.key("device_traces", &place)?;
        let traces = place.field("device_traces");
        self.list(&snapshot.device_traces, &traces, |w, trace, p| w.list(trace, p, |w, e, p| w.entry(e, p)))?;
        if let Some(settings) = &snapshot.allocator_settings {
            self.key("allocator_settings", &place)?;
            self.settings(settings, &place.field("allocator_settings"))?;
        }
        self.key("external_annotations", &place)?;
        let external = place.field("external_annotations");
        self.list(&snapshot.external_annotations, &external, |w, a, p| w.annotation(a, p))?;
        self.end_dict();
        self.out.push(op::STOP);
        Ok(())
    }

    fn segment(&mut self, segment: &'s TorchSegment, place: &Place<'_>) -> Result<(), PickleError> {
        self.begin_dict();
        self.key("device", place)?;
        self.int(segment.device.into());
        self.key("address", place)?;
        self.int(segment.address.into());
        self.key("total_size", place)?;
        self.int(segment.total_size.into());
        self.key("allocated_size", place)?;
        self.int(segment.allocated_size.into());
        self.key("active_size", place)?;
        self.int(segment.active_size.into());
        self.key("requested_size", place)?;
        self.int(segment.requested_size.into());
        self.key("stream", place)?;
        self.stream(segment.stream);
        self.key("segment_type", place)?;
        self.string(segment.segment_type.name(), place)?;
        self.key("segment_pool_id", place)?;
        // PyTorch's pool ids are unsigned; ours keep their bits.
        self.int((segment.segment_pool_id.0 as u64).into());
        self.int((segment.segment_pool_id.1 as u64).into());
        self.out.push(op::TUPLE2);
        self.key("is_expandable", place)?;
        self.boolean(segment.is_expandable);
        self.key("frames", place)?;
        self.stack_or_empty(segment.frames, &place.field("frames"))?;
        self.key("blocks", place)?;
        self.list(&segment.blocks, &place.field("blocks"), |w, b, p| w.block(b, p))?;
        self.end_dict();
        Ok(())
    }

    fn block(&mut self, block: &'s TorchBlock, place: &Place<'_>) -> Result<(), PickleError> {
        self.begin_dict();
        self.key("address", place)?;
        self.int(block.address.into());
        self.key("size", place)?;
        self.int(block.size.into());
        self.key("requested_size", place)?;
        self.int(block.requested_size.into());
        self.key("state", place)?;
        self.string(block.state.name(), place)?;
        self.key("frames", place)?;
        self.stack_or_empty(block.frames, &place.field("frames"))?;
        self.end_dict();
        Ok(())
    }

    fn entry(&mut self, entry: &'s TraceEntry, place: &Place<'_>) -> Result<(), PickleError> {
        let contexts = self.contexts;
        let (compile_context, user_metadata) = match entry.annotation {
            None => ("N/A", ""),
            Some(id) => match contexts.annotation(id) {
                Some(a) => (a.compile_context.as_str(), a.user_metadata.as_str()),
                None => {
                    return Err(place.unwritable(format!(
                        "annotation {} is not in the snapshot's context table ({} annotations)",
                        id.0,
                        contexts.annotations().len()
                    )));
                }
            },
        };
        self.begin_dict();
        self.key("action", place)?;
        self.string(entry.action.name(), place)?;
        self.key(if entry.action == TraceAction::Oom { "device_free" } else { "addr" }, place)?;
        self.int(entry.addr.into());
        self.key("size", place)?;
        self.int(entry.size.into());
        self.key("stream", place)?;
        self.stream(entry.stream.0);
        self.key("time_us", place)?;
        self.int(entry.time_us.into());
        self.key("compile_context", place)?;
        self.string(compile_context, place)?;
        self.key("user_metadata", place)?;
        self.string(user_metadata, place)?;
        if let Some(context) = entry.context {
            self.key("frames", place)?;
            self.stack(context, &place.field("frames"))?;
        }
        self.end_dict();
        Ok(())
    }

    fn settings(&mut self, settings: &'s TorchAllocatorSettings, place: &Place<'_>) -> Result<(), PickleError> {
        self.begin_dict();
        self.key("PYTORCH_CUDA_ALLOC_CONF", place)?;
        self.string(&settings.settings, place)?;
        self.key("max_split_size", place)?;
        self.int(settings.max_split_size.into());
        self.key("garbage_collection_threshold", place)?;
        self.float(settings.garbage_collection_threshold);
        self.key("expandable_segments", place)?;
        self.boolean(settings.expandable_segments);
        self.key("pinned_num_register_threads", place)?;
        self.int(settings.pinned_num_register_threads.into());
        self.key("release_lock_on_cudamalloc", place)?;
        self.boolean(settings.release_lock_on_cudamalloc);
        self.key("pinned_use_cuda_host_register", place)?;
        self.boolean(settings.pinned_use_cuda_host_register);
        self.key("graph_capture_record_stream_reuse", place)?;
        self.boolean(settings.graph_capture_record_stream_reuse);
        self.key("roundup_power2_divisions", place)?;
        self.begin_dict();
        for (&key, divisions) in ROUNDUP_KEYS.iter().zip(settings.roundup_power2_divisions) {
            self.string(key, place)?;
            self.int(divisions.into());
        }
        self.end_dict();
        self.end_dict();
        Ok(())
    }

    fn annotation(&mut self, annotation: &'s ExternalAnnotation, place: &Place<'_>) -> Result<(), PickleError> {
        self.begin_dict();
        self.key("stage", place)?;
        self.string(&annotation.stage, place)?;
        self.key("name", place)?;
        self.string(&annotation.name, place)?;
        self.key("device", place)?;
        self.int(annotation.device.into());
        self.key("time_us", place)?;
        self.int(annotation.time_us.into());
        self.end_dict();
        Ok(())
    }
}
