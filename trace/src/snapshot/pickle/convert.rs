//! The reader's conversions: typed containers → the snapshot's segments, blocks, entries...
//!
//! Each field is read the way PyTorch 2.11 writes it (`torch/csrc/cuda/Module.cpp`,
//! `_cuda_memorySnapshot`): sizes and addresses are `size_t` (non-negative), a stream is its
//! `cudaStream_t` cast to `int64_t`, a frame's `line` is a `uint64_t` (an unknown line, as in
//! code that torch.compile generated, is `2^64 − 1`), a pool id a pair of `unsigned long long`,
//! times are `time_t` and devices `int8_t`. Where our type has the other signedness (a stream
//! id is `u64`, a line and a pool id `i64`), the field keeps its 64 bits, and the writer writes
//! them back with PyTorch's signedness. Missing optional keys get the values PyTorch writes
//! for them; anything else that does not fit is an error naming its place.

use super::*;
use place::{At, Spot};
use stream::{Data, Fields, Flow, Kind, MAX_FIELDS, Node, PendingBlock, Role, Stream, Val};

impl<'b> Stream<'b> {
    /// Python's name for the type of a value, with an article.
    fn type_name(&self, val: Val) -> &'static str {
        match val {
            Val::None => "None",
            Val::Bool(_) => "a bool",
            Val::Int(_) | Val::Big(_) | Val::Long => "an integer",
            Val::Bytes => "bytes",
            Val::Float(_) => "a float",
            Val::Str { .. } => "a string",
            Val::Node(_) => self.node(val).map_or("a container", |n| n.kind.article()),
        }
    }

    #[cold]
    fn expected(&self, spot: Spot<'_>, what: &str, found: Val) -> Box<PickleError> {
        let message = match found {
            Val::Long if what == "an integer" => "an integer wider than 64 bits, which no field holds".to_owned(),
            _ => format!("expected {what}, found {}", self.type_name(found)),
        };
        self.invalid(spot, message)
    }

    /// A field that must be there.
    #[inline]
    fn required<'s, T>(&self, value: Option<T>, spot: impl FnOnce() -> Spot<'s>) -> Flow<T> {
        let Some(value) = value else {
            let spot = spot();
            return Err(match spot.tail {
                place::Tail::Field(name) => self.invalid(spot.at.here(), format!("missing key {name:?}")),
                _ => self.invalid(spot, "missing"),
            });
        };
        Ok(value)
    }

    /// A size or an address (`size_t`).
    #[inline]
    fn unsigned<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<u64>> {
        match val {
            None => Ok(None),
            Some(Val::Big(u)) => Ok(Some(u)),
            Some(Val::Int(i)) => match u64::try_from(i) {
                Ok(u) => Ok(Some(u)),
                Err(_) => Err(self.invalid(spot(), format!("expected a non-negative integer, found {i}"))),
            },
            Some(other) => Err(self.expected(spot(), "an integer", other)),
        }
    }

    /// A signed 64-bit field (a time, a device, a count).
    #[inline]
    fn signed<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<i64>> {
        match val {
            None => Ok(None),
            Some(Val::Int(i)) => Ok(Some(i)),
            Some(Val::Big(u)) => Err(self.invalid(spot(), format!("{u} does not fit in a signed 64-bit integer"))),
            Some(other) => Err(self.expected(spot(), "an integer", other)),
        }
    }

    /// A 64-bit field written signed by some writers and unsigned by others (a stream handle,
    /// a frame's line, a pool id): its 64 bits.
    #[inline]
    fn bits<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<u64>> {
        match val {
            None => Ok(None),
            Some(Val::Int(i)) => Ok(Some(i as u64)),
            Some(Val::Big(u)) => Ok(Some(u)),
            Some(other) => Err(self.expected(spot(), "an integer", other)),
        }
    }

    #[inline]
    fn float<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<f64>> {
        match val {
            None => Ok(None),
            Some(Val::Float(f)) => Ok(Some(f)),
            Some(Val::Int(i)) => Ok(Some(i as f64)),
            Some(Val::Big(u)) => Ok(Some(u as f64)),
            Some(other) => Err(self.expected(spot(), "a float", other)),
        }
    }

    #[inline]
    fn boolean<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<bool>> {
        match val {
            None => Ok(None),
            Some(Val::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(self.expected(spot(), "a bool", other)),
        }
    }

    #[inline]
    fn string<'s>(&self, val: Option<Val>, spot: impl FnOnce() -> Spot<'s>) -> Flow<Option<&'b str>> {
        match val {
            None => Ok(None),
            Some(val) => match self.text(val) {
                Some(text) => Ok(Some(text)),
                None if matches!(val, Val::Str { .. }) => Err(self.invalid(spot(), "not valid UTF-8")),
                None => Err(self.expected(spot(), "a string", val)),
            },
        }
    }

    /// Checks that `val` is a container typed `role` where it was created; `at` is where it
    /// is placed now.
    fn check_node(&self, val: Val, role: Role, at: At) -> Flow<()> {
        let Some(node) = self.node(val) else { return Err(self.expected(at.here(), role.expected(), val)) };
        if node.role == role {
            return Ok(());
        }
        if !role.accepts(node.kind) {
            return Err(self.expected(at.here(), role.expected(), val));
        }
        Err(self.invalid(
            at.here(),
            match node.role {
                Role::Ignored => format!(
                    "{} met first where the snapshot holds no such value (shared from there through the \
                     pickle's memo, or built in an order Python's pickler does not use)",
                    node.kind.article()
                ),
                other => format!(
                    "{} that also stands elsewhere in the file as {} (shared through the pickle's memo), \
                     which a snapshot never does",
                    node.kind.article(),
                    other.describe()
                ),
            },
        ))
    }

    /// Moves a typed container's data out: each list, segment or entry is converted once.
    #[inline]
    fn take<T>(&mut self, val: Val, role: Role, at: At, unwrap: fn(Data) -> Option<T>) -> Flow<T> {
        if let Val::Node(index) = val
            && let Some(node) = self.nodes.get_mut(index as usize)
            && node.role == role
        {
            let kind = node.kind;
            return match unwrap(std::mem::replace(&mut node.data, Data::Nothing)) {
                Some(data) => Ok(data),
                None => Err(self.invalid(
                    at.here(),
                    format!(
                        "{} that already stands at an earlier place (shared through the pickle's memo); \
                         PyTorch writes each one once",
                        kind.article()
                    ),
                )),
            };
        }
        self.check_node(val, role, at)?;
        Err(self.expected(at.here(), role.expected(), val))
    }

    /// A typed dict's fields, moved out. Read them and hand the box to [`Stream::recycle`].
    fn fields(&mut self, val: Val, role: Role, at: At) -> Flow<Box<Fields>> {
        self.take(val, role, at, |data| match data {
            Data::Fields(fields) => Some(fields),
            _ => None,
        })
    }

    /// A dict's field box, emptied for the next dict: one allocation per dict alive at once.
    fn recycle(&mut self, mut fields: Box<Fields>) {
        fields.values = [None; MAX_FIELDS];
        self.spare.push(fields);
    }

    /// The frame list `val` under `owner`'s `frames`: interned once, by the list (its memo
    /// identity).
    fn stack_id(&mut self, val: Val, owner: At) -> Flow<ContextId> {
        if let Val::Node(index) = val
            && let Some(node) = self.nodes.get_mut(index as usize)
            && node.role == Role::Stack
        {
            let id = match &node.data {
                Data::Interned(id) => *id,
                Data::Frames(list) => self.contexts.intern(&list.items),
                _ => {
                    let at = owner.child(Role::Stack);
                    return Err(self.invalid(at.here(), "a list of frames still being built (corrupt file?)"));
                }
            };
            node.data = Data::Interned(id);
            return Ok(id);
        }
        let at = owner.child(Role::Stack);
        self.check_node(val, Role::Stack, at)?;
        Err(self.expected(at.here(), Role::Stack.expected(), val))
    }

    /// A segment's or block's stack (`owner`'s `frames`): `[]` (PyTorch's "none recorded") is `None`.
    fn stack_or_none(&mut self, val: Option<Val>, owner: At) -> Flow<Option<ContextId>> {
        let Some(val) = val else { return Ok(None) };
        self.check_node(val, Role::Stack, owner.child(Role::Stack))?;
        let empty = match self.node(val).map(|n| &n.data) {
            Some(Data::Frames(list)) => list.items.is_empty(),
            Some(Data::Interned(id)) => self.contexts.frames(*id).is_empty(),
            _ => false,
        };
        if empty { Ok(None) } else { self.stack_id(val, owner).map(Some) }
    }

    pub(super) fn frame(&mut self, val: Val, at: At) -> Flow<Frame> {
        if let Some(Node { data: Data::Frame(frame), role: Role::Frame, .. }) = self.node(val) {
            return Ok(Frame::clone(frame));
        }
        let fields = self.fields(val, Role::Frame, at)?;
        let [filename, line, name, ..] = fields.values;
        self.recycle(fields);
        let filename = self.required(self.string(filename, || at.field("filename"))?, || at.field("filename"))?;
        let line = self.required(self.bits(line, || at.field("line"))?, || at.field("line"))?;
        let name = self.required(self.string(name, || at.field("name"))?, || at.field("name"))?;
        // The line keeps PyTorch's 64 bits in our signed field: an unknown one, 2^64 - 1, is -1.
        let frame = Frame { filename: self.name(filename), line: line as i64, name: self.name(name) };
        if let Val::Node(index) = val {
            self.nodes[index as usize].data = Data::Frame(Box::new(frame.clone()));
        }
        Ok(frame)
    }

    fn name(&mut self, text: &str) -> Arc<str> {
        if let Some(name) = self.names.get(text) {
            return name.clone();
        }
        let name: Arc<str> = text.into();
        self.names.insert(name.clone());
        name
    }

    pub(super) fn trace(&mut self, val: Val, at: At) -> Flow<Vec<TraceEntry>> {
        self.take(val, Role::Trace, at, |data| match data {
            Data::Trace(list) => Some(list.items),
            _ => None,
        })
    }

    pub(super) fn entry(&mut self, val: Val, at: At) -> Flow<TraceEntry> {
        let fields = self.fields(val, Role::Entry, at)?;
        let [action, addr, device_free, size, stream, time_us, frames, compile_context, user_metadata, ..] =
            fields.values;
        self.recycle(fields);
        let name = self.required(self.string(action, || at.field("action"))?, || at.field("action"))?;
        let Some(action) = TraceAction::from_name(name) else {
            let known: Vec<&str> = TraceAction::ALL.iter().map(|a| a.name()).collect();
            let message = format!("unknown action {name:?} (known: {})", known.join(", "));
            return Err(self.invalid(at.field("action"), message));
        };
        // An `oom` entry keeps the device's free bytes under `device_free` instead of `addr`.
        let addr = match (action, device_free) {
            (TraceAction::Oom, Some(_)) => self.unsigned(device_free, || at.field("device_free"))?,
            (TraceAction::Oom, None) if addr.is_none() => None,
            _ => self.unsigned(addr, || at.field("addr"))?,
        };
        let missing = if action == TraceAction::Oom && addr.is_none() { "device_free" } else { "addr" };
        let addr = self.required(addr, || at.field(missing))?;
        let compile_context = self.string(compile_context, || at.field("compile_context"))?.unwrap_or("N/A");
        let user_metadata = self.string(user_metadata, || at.field("user_metadata"))?.unwrap_or("");
        Ok(TraceEntry {
            action,
            addr,
            size: self.required(self.unsigned(size, || at.field("size"))?, || at.field("size"))?,
            stream: StreamId(self.bits(stream, || at.field("stream"))?.unwrap_or(0)),
            time_us: self.signed(time_us, || at.field("time_us"))?.unwrap_or(0),
            // An entry without the key had no context; `[]` is a context without Python frames.
            context: match frames {
                Some(frames) => Some(self.stack_id(frames, at)?),
                None => None,
            },
            annotation: self.contexts.intern_annotation(compile_context, user_metadata),
        })
    }

    pub(super) fn block(&mut self, val: Val, at: At) -> Flow<PendingBlock> {
        let fields = self.fields(val, Role::Block, at)?;
        let [address, size, requested_size, state, frames, ..] = fields.values;
        self.recycle(fields);
        let size = self.required(self.unsigned(size, || at.field("size"))?, || at.field("size"))?;
        let state_name = self.required(self.string(state, || at.field("state"))?, || at.field("state"))?;
        let Some(state) = BlockState::from_name(state_name) else {
            let message = format!(
                "unknown block state {state_name:?} (expected \"active_allocated\", \"active_pending_free\" or \"inactive\")"
            );
            return Err(self.invalid(at.field("state"), message));
        };
        Ok(PendingBlock {
            address: self.unsigned(address, || at.field("address"))?,
            size,
            requested_size: self.unsigned(requested_size, || at.field("requested_size"))?.unwrap_or(size),
            state,
            frames: self.stack_or_none(frames, at)?,
        })
    }

    pub(super) fn segment(&mut self, val: Val, at: At) -> Flow<TorchSegment> {
        let [
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            segment_pool_id,
            is_expandable,
            frames,
            blocks,
            ..,
        ] = self.fields(val, Role::Segment, at)?.values;
        let address = self.required(self.unsigned(address, || at.field("address"))?, || at.field("address"))?;
        let total_size =
            self.required(self.unsigned(total_size, || at.field("total_size"))?, || at.field("total_size"))?;
        let frames = self.stack_or_none(frames, at)?;
        let blocks = self.required(blocks, || at.field("blocks"))?;
        let pending = self.take(blocks, Role::Blocks, at.child(Role::Blocks), |data| match data {
            Data::Blocks(list) => Some(list.items),
            _ => None,
        })?;
        // PyTorch 2.11 writes every block's address; without it, blocks follow one another.
        let mut blocks = Vec::with_capacity(pending.len());
        let mut next = address;
        for block in pending {
            let address = block.address.unwrap_or(next);
            next = address.saturating_add(block.size);
            blocks.push(TorchBlock {
                address,
                size: block.size,
                requested_size: block.requested_size,
                state: block.state,
                frames: block.frames,
            });
        }
        let sum = |keep: fn(BlockState) -> bool, size: fn(&TorchBlock) -> u64| {
            blocks.iter().filter(|b| keep(b.state)).fold(0u64, |sum, b| sum.saturating_add(size(b)))
        };
        // 2.11 always writes it; without it, only the small pool's segments are 2 MiB.
        let segment_type = match self.string(segment_type, || at.field("segment_type"))? {
            None if total_size <= SMALL_BUFFER => PoolKind::Small,
            None => PoolKind::Large,
            Some("small") => PoolKind::Small,
            Some("large") => PoolKind::Large,
            Some(other) => {
                let message = format!("unknown segment type {other:?} (expected \"small\" or \"large\")");
                return Err(self.invalid(at.field("segment_type"), message));
            }
        };
        let segment_pool_id = match segment_pool_id {
            None => (0, 0),
            Some(pair) => self.pool_id(pair, at.child(Role::PoolId))?,
        };
        Ok(TorchSegment {
            device: self.signed(device, || at.field("device"))?.unwrap_or(0),
            address,
            total_size,
            allocated_size: match self.unsigned(allocated_size, || at.field("allocated_size"))? {
                Some(size) => size,
                None => sum(|s| s == BlockState::ActiveAllocated, |b| b.size),
            },
            active_size: match self.unsigned(active_size, || at.field("active_size"))? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.size),
            },
            requested_size: match self.unsigned(requested_size, || at.field("requested_size"))? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.requested_size),
            },
            stream: self.bits(stream, || at.field("stream"))?.unwrap_or(0),
            segment_type,
            segment_pool_id,
            is_expandable: self.boolean(is_expandable, || at.field("is_expandable"))?.unwrap_or(false),
            frames,
            blocks,
        })
    }

    /// `segment_pool_id`, read in place: one tuple may be shared by many segments. Each id
    /// keeps its 64 bits (PyTorch's are unsigned).
    fn pool_id(&self, val: Val, at: At) -> Flow<(i64, i64)> {
        self.check_node(val, Role::PoolId, at)?;
        let Some(Data::Items(list)) = self.node(val).map(|n| &n.data) else {
            return Err(self.expected(at.here(), Role::PoolId.expected(), val));
        };
        let [a, b] = list.items[..] else {
            return Err(self.invalid(at.here(), format!("expected a pair, found {} items", list.items.len())));
        };
        let id = |val: Val, i: usize| self.required(self.bits(Some(val), || at.nth(i))?, || at.nth(i));
        Ok((id(a, 0)? as i64, id(b, 1)? as i64))
    }

    pub(super) fn annotation(&mut self, val: Val, at: At) -> Flow<ExternalAnnotation> {
        let [stage, name, device, time_us, ..] = self.fields(val, Role::Annotation, at)?.values;
        Ok(ExternalAnnotation {
            stage: self.string(stage, || at.field("stage"))?.unwrap_or_default().to_owned(),
            name: self.string(name, || at.field("name"))?.unwrap_or_default().to_owned(),
            device: self.signed(device, || at.field("device"))?.unwrap_or(0),
            time_us: self.signed(time_us, || at.field("time_us"))?.unwrap_or(0),
        })
    }

    fn settings(&mut self, val: Val) -> Flow<TorchAllocatorSettings> {
        let at = At::Settings;
        let [
            conf,
            max_split_size,
            gc_threshold,
            expandable,
            register_threads,
            release_lock,
            host_register,
            record_stream_reuse,
            divisions,
            ..,
        ] = self.fields(val, Role::Settings, at)?.values;
        let roundup_power2_divisions = match divisions {
            None => [0; ROUNDUP_INTERVALS],
            Some(divisions) => {
                let values = self.fields(divisions, Role::Divisions, At::Divisions)?.values;
                let mut out = [0; ROUNDUP_INTERVALS];
                for ((slot, value), key) in out.iter_mut().zip(values).zip(ROUNDUP_KEYS) {
                    *slot = self.unsigned(value, || At::Divisions.key(key))?.unwrap_or(0);
                }
                out
            }
        };
        let bool_or_false = |val, name| self.boolean(val, || at.field(name)).map(|b| b.unwrap_or(false));
        // Missing keys get the values PyTorch reports for an empty configuration.
        Ok(TorchAllocatorSettings {
            settings: self.string(conf, || at.field("PYTORCH_CUDA_ALLOC_CONF"))?.unwrap_or("").to_owned(),
            max_split_size: match max_split_size {
                // "Unlimited" written as SIZE_MAX rather than -1.
                Some(Val::Big(u64::MAX)) => -1,
                other => self.signed(other, || at.field("max_split_size"))?.unwrap_or(-1),
            },
            garbage_collection_threshold: self
                .float(gc_threshold, || at.field("garbage_collection_threshold"))?
                .unwrap_or(0.0),
            expandable_segments: bool_or_false(expandable, "expandable_segments")?,
            pinned_num_register_threads: self
                .signed(register_threads, || at.field("pinned_num_register_threads"))?
                .unwrap_or(1),
            release_lock_on_cudamalloc: bool_or_false(release_lock, "release_lock_on_cudamalloc")?,
            pinned_use_cuda_host_register: bool_or_false(host_register, "pinned_use_cuda_host_register")?,
            graph_capture_record_stream_reuse: bool_or_false(record_stream_reuse, "graph_capture_record_stream_reuse")?,
            roundup_power2_divisions,
        })
    }

    /// The snapshot: the dict of `_dump_snapshot`, or a bare list of segments.
    pub(super) fn root(&mut self, root: Val) -> Flow<TorchSnapshot> {
        let segments = |data| match data {
            Data::Segments(list) => Some(list.items),
            _ => None,
        };
        match self.node(root).map(|n| n.kind) {
            Some(Kind::List) if self.bare => {
                let segments = self.take(root, Role::Segments, At::Segments, segments)?;
                return Ok(TorchSnapshot {
                    segments,
                    contexts: std::mem::take(&mut self.contexts),
                    ..TorchSnapshot::default()
                });
            }
            Some(Kind::Dict) => {}
            _ => return Err(self.expected(At::Root.here(), "a snapshot dict or a list of segments", root)),
        }
        let at = At::Root;
        let [segments_val, device_traces, allocator_settings, external_annotations, ..] =
            self.fields(root, Role::Root, at)?.values;
        let segments_val = self.required(segments_val, || at.field("segments"))?;
        let segments = self.take(segments_val, Role::Segments, At::Segments, segments)?;
        let traces = |data| match data {
            Data::Traces(list) => Some(list.items),
            _ => None,
        };
        let annotations = |data| match data {
            Data::Annotations(list) => Some(list.items),
            _ => None,
        };
        let device_traces = device_traces.map(|v| self.take(v, Role::DeviceTraces, At::DeviceTraces, traces));
        let device_traces = device_traces.transpose()?.unwrap_or_default();
        let allocator_settings = allocator_settings.map(|s| self.settings(s)).transpose()?;
        let external_annotations =
            external_annotations.map(|v| self.take(v, Role::Annotations, At::Annotations, annotations));
        let external_annotations = external_annotations.transpose()?.unwrap_or_default();
        Ok(TorchSnapshot {
            segments,
            device_traces,
            allocator_settings,
            external_annotations,
            contexts: std::mem::take(&mut self.contexts),
        })
    }
}

/// Numbers the stacks and annotations in field order (segments, then traces), as they are
/// met there, not in the order of the file: the ids then depend only on the snapshot.
pub(super) fn finish(mut snapshot: TorchSnapshot) -> TorchSnapshot {
    let local = std::mem::take(&mut snapshot.contexts);
    let mut table = ContextTable::default();
    let mut stacks: Vec<Option<ContextId>> = vec![None; local.stacks().len()];
    let mut annotations: Vec<Option<AnnotationId>> = vec![None; local.annotations().len()];
    let mut stack = |id: &mut Option<ContextId>, table: &mut ContextTable| {
        if let Some(old) = id
            && let Some(slot) = stacks.get_mut(old.0 as usize)
        {
            *id = Some(*slot.get_or_insert_with(|| table.intern(local.frames(*old))));
        }
    };
    for segment in &mut snapshot.segments {
        stack(&mut segment.frames, &mut table);
        for block in &mut segment.blocks {
            stack(&mut block.frames, &mut table);
        }
    }
    for entry in snapshot.device_traces.iter_mut().flatten() {
        stack(&mut entry.context, &mut table);
        if let Some(old) = entry.annotation
            && let Some(slot) = annotations.get_mut(old.0 as usize)
        {
            if slot.is_none()
                && let Some(a) = local.annotation(old)
            {
                *slot = table.intern_annotation(&a.compile_context, &a.user_metadata);
            }
            entry.annotation = *slot;
        }
    }
    snapshot.contexts = table;
    snapshot
}
