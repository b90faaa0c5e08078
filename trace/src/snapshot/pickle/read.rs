//! Reading: value graph → TorchSnapshot

use super::*;

/// Python's name for the type of a value, with an article.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::I64(_) | Value::Int(_) => "an integer",
        Value::F64(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Set(_) | Value::FrozenSet(_) => "a set",
        Value::Dict(_) => "a dict",
        Value::Object(_) | Value::Weak(_) => "an object",
    }
}

fn expected(place: &Place<'_>, what: &str, found: &Value) -> PickleError {
    place.invalid(format!("expected {what}, found {}", type_name(found)))
}

fn as_dict<'v>(value: &'v Value, place: &Place<'_>) -> Result<std::cell::Ref<'v, Dict>, PickleError> {
    match value {
        Value::Dict(d) => Ok(d.inner()),
        other => Err(expected(place, "a dict", other)),
    }
}

fn as_list<'v>(value: &'v Value, place: &Place<'_>) -> Result<std::cell::Ref<'v, Vec<Value>>, PickleError> {
    match value {
        Value::List(l) => Ok(l.inner()),
        other => Err(expected(place, "a list", other)),
    }
}

fn as_str<'v>(value: &'v Value, place: &Place<'_>) -> Result<&'v str, PickleError> {
    match value {
        Value::String(s) => Ok(s.inner().as_str()),
        other => Err(expected(place, "a string", other)),
    }
}

fn as_u64(value: &Value, place: &Place<'_>) -> Result<u64, PickleError> {
    match value {
        Value::I64(i) => {
            u64::try_from(*i).map_err(|_| place.invalid(format!("expected a non-negative integer, found {i}")))
        }
        Value::Int(big) => big.to_u64().ok_or_else(|| place.invalid(format!("{big} does not fit in 64 bits"))),
        other => Err(expected(place, "an integer", other)),
    }
}

fn as_i64(value: &Value, place: &Place<'_>) -> Result<i64, PickleError> {
    match value {
        Value::I64(i) => Ok(*i),
        Value::Int(big) => Err(place.invalid(format!("{big} does not fit in a signed 64-bit integer"))),
        other => Err(expected(place, "an integer", other)),
    }
}

fn as_f64(value: &Value, place: &Place<'_>) -> Result<f64, PickleError> {
    match value {
        Value::F64(f) => Ok(*f),
        Value::I64(i) => Ok(*i as f64),
        Value::Int(big) => big.to_f64().ok_or_else(|| place.invalid(format!("{big} is not a usable float"))),
        other => Err(expected(place, "a float", other)),
    }
}

fn as_bool(value: &Value, place: &Place<'_>) -> Result<bool, PickleError> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(expected(place, "a bool", other)),
    }
}

/// The values of the string keys `names` in `dict` (dicts are small: one pass, no allocation).
fn fields<'d, const N: usize>(dict: &'d Dict, names: [&str; N]) -> [Option<&'d Value>; N] {
    let mut out = [None; N];
    for (key, value) in dict.iter() {
        if let HashableValue::String(key) = key
            && let Some(i) = names.iter().position(|n| *n == key.inner().as_str())
        {
            out[i] = Some(value);
        }
    }
    out
}

/// Converts a field that may be missing.
fn optional<'v, T>(
    value: Option<&'v Value>,
    place: &Place<'_>,
    name: &str,
    convert: impl FnOnce(&'v Value, &Place<'_>) -> Result<T, PickleError>,
) -> Result<Option<T>, PickleError> {
    value.map(|v| convert(v, &place.field(name))).transpose()
}

/// Converts a field that must be there.
fn required<'v, T>(
    value: Option<&'v Value>,
    place: &Place<'_>,
    name: &str,
    convert: impl FnOnce(&'v Value, &Place<'_>) -> Result<T, PickleError>,
) -> Result<T, PickleError> {
    optional(value, place, name, convert)?.ok_or_else(|| place.invalid(format!("missing key {name:?}")))
}

/// Builds the typed snapshot, interning stacks as it goes.
pub(super) struct Reader {
    contexts: ContextTable,
    /// Frame lists already interned, by the identity of the shared list.
    stacks_by_identity: FxHashMap<usize, ContextId>,
    /// File and function names, shared between frames.
    names: FxHashSet<Arc<str>>,
    /// Segments, blocks, entries and annotations still allowed: at most one per input byte,
    /// so that a list referenced a million times cannot turn a small file into a huge snapshot.
    budget: usize,
}

impl Reader {
    pub(super) fn new(input_len: usize) -> Self {
        Reader {
            contexts: ContextTable::default(),
            stacks_by_identity: FxHashMap::default(),
            names: FxHashSet::default(),
            budget: input_len,
        }
    }

    fn spend(&mut self, elements: usize, place: &Place<'_>) -> Result<(), PickleError> {
        match self.budget.checked_sub(elements) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(place.invalid("more elements than the file has bytes (a list shared many times?)")),
        }
    }

    pub(super) fn root(&mut self, root: &Value) -> Result<TorchSnapshot, PickleError> {
        let place = Place::ROOT;
        match root {
            Value::Dict(_) => self.snapshot(root, &place),
            Value::List(_) => {
                let segments = self.segments(root, &place)?;
                let snapshot = TorchSnapshot {
                    segments,
                    contexts: std::mem::take(&mut self.contexts),
                    ..TorchSnapshot::default()
                };
                Ok(snapshot)
            }
            other => Err(expected(&place, "a snapshot dict or a list of segments", other)),
        }
    }

    fn snapshot(&mut self, value: &Value, place: &Place<'_>) -> Result<TorchSnapshot, PickleError> {
        let dict = as_dict(value, place)?;
        let [segments, device_traces, allocator_settings, external_annotations] =
            fields(&dict, ["segments", "device_traces", "allocator_settings", "external_annotations"]);
        let segments = required(segments, place, "segments", |v, p| self.segments(v, p))?;
        let device_traces = optional(device_traces, place, "device_traces", |v, p| self.device_traces(v, p))?;
        let allocator_settings = optional(allocator_settings, place, "allocator_settings", settings)?;
        let annotations = optional(external_annotations, place, "external_annotations", |v, p| self.annotations(v, p))?;
        Ok(TorchSnapshot {
            segments,
            device_traces: device_traces.unwrap_or_default(),
            allocator_settings,
            external_annotations: annotations.unwrap_or_default(),
            contexts: std::mem::take(&mut self.contexts),
        })
    }

    fn segments(&mut self, value: &Value, place: &Place<'_>) -> Result<Vec<TorchSegment>, PickleError> {
        let list = as_list(value, place)?;
        self.spend(list.len(), place)?;
        list.iter().enumerate().map(|(i, s)| self.segment(s, &place.index(i))).collect()
    }

    fn segment(&mut self, value: &Value, place: &Place<'_>) -> Result<TorchSegment, PickleError> {
        let dict = as_dict(value, place)?;
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
        ] = fields(
            &dict,
            [
                "device",
                "address",
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
                "stream",
                "segment_type",
                "segment_pool_id",
                "is_expandable",
                "frames",
                "blocks",
            ],
        );
        let address = required(address, place, "address", as_u64)?;
        let total_size = required(total_size, place, "total_size", as_u64)?;
        let frames = optional(frames, place, "frames", |v, p| self.stack_or_none(v, p))?.flatten();
        let blocks = required(blocks, place, "blocks", |v, p| self.blocks(v, p, address))?;
        let sum = |keep: fn(BlockState) -> bool, size: fn(&TorchBlock) -> u64| {
            blocks.iter().filter(|b| keep(b.state)).fold(0u64, |sum, b| sum.saturating_add(size(b)))
        };
        Ok(TorchSegment {
            device: optional(device, place, "device", as_i64)?.unwrap_or(0),
            address,
            total_size,
            allocated_size: match optional(allocated_size, place, "allocated_size", as_u64)? {
                Some(size) => size,
                None => sum(|s| s == BlockState::ActiveAllocated, |b| b.size),
            },
            active_size: match optional(active_size, place, "active_size", as_u64)? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.size),
            },
            requested_size: match optional(requested_size, place, "requested_size", as_u64)? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.requested_size),
            },
            stream: optional(stream, place, "stream", as_u64)?.unwrap_or(0),
            // 2.11 always writes it; without it, only the small pool's segments are 2 MiB.
            segment_type: optional(segment_type, place, "segment_type", pool_kind)?
                .unwrap_or(if total_size <= SMALL_BUFFER { PoolKind::Small } else { PoolKind::Large }),
            segment_pool_id: optional(segment_pool_id, place, "segment_pool_id", pool_id)?.unwrap_or((0, 0)),
            is_expandable: optional(is_expandable, place, "is_expandable", as_bool)?.unwrap_or(false),
            frames,
            blocks,
        })
    }

    fn blocks(
        &mut self,
        value: &Value,
        place: &Place<'_>,
        segment_address: u64,
    ) -> Result<Vec<TorchBlock>, PickleError> {
        let list = as_list(value, place)?;
        self.spend(list.len(), place)?;
        let mut blocks = Vec::with_capacity(list.len());
        let mut next = segment_address;
        for (i, block) in list.iter().enumerate() {
            let block = self.block(block, &place.index(i), next)?;
            next = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        Ok(blocks)
    }

    fn block(&mut self, value: &Value, place: &Place<'_>, default_address: u64) -> Result<TorchBlock, PickleError> {
        let dict = as_dict(value, place)?;
        let [address, size, requested_size, state, frames] =
            fields(&dict, ["address", "size", "requested_size", "state", "frames"]);
        let size = required(size, place, "size", as_u64)?;
        Ok(TorchBlock {
            address: optional(address, place, "address", as_u64)?.unwrap_or(default_address),
            size,
            requested_size: optional(requested_size, place, "requested_size", as_u64)?.unwrap_or(size),
            state: required(state, place, "state", block_state)?,
            frames: optional(frames, place, "frames", |v, p| self.stack_or_none(v, p))?.flatten(),
        })
    }

    fn device_traces(&mut self, value: &Value, place: &Place<'_>) -> Result<Vec<Vec<TraceEntry>>, PickleError> {
        let list = as_list(value, place)?;
        for (device, trace) in list.iter().enumerate() {
            let place = place.index(device);
            self.spend(as_list(trace, &place)?.len(), &place)?;
        }
        let mut traces = Vec::with_capacity(list.len());
        for (device, trace) in list.iter().enumerate() {
            let place = place.index(device);
            let entries = as_list(trace, &place)?;
            let trace: Result<Vec<_>, _> =
                entries.iter().enumerate().map(|(i, e)| self.entry(e, &place.index(i))).collect();
            traces.push(trace?);
        }
        Ok(traces)
    }

    fn entry(&mut self, value: &Value, place: &Place<'_>) -> Result<TraceEntry, PickleError> {
        let dict = as_dict(value, place)?;
        let [action, addr, device_free, size, stream, time_us, frames, compile_context, user_metadata] = fields(
            &dict,
            [
                "action",
                "addr",
                "device_free",
                "size",
                "stream",
                "time_us",
                "frames",
                "compile_context",
                "user_metadata",
            ],
        );
        let action = required(action, place, "action", |v, p| {
            let name = as_str(v, p)?;
            TraceAction::from_name(name).ok_or_else(|| {
                let known: Vec<&str> = TraceAction::ALL.iter().map(|a| a.name()).collect();
                p.invalid(format!("unknown action {name:?} (known: {})", known.join(", ")))
            })
        })?;
        // An `oom` entry keeps the device's free bytes under `device_free` instead of `addr`.
        let addr = match (action, device_free) {
            (TraceAction::Oom, Some(free)) => as_u64(free, &place.field("device_free"))?,
            (TraceAction::Oom, None) if addr.is_none() => return Err(place.invalid("missing key \"device_free\"")),
            _ => required(addr, place, "addr", as_u64)?,
        };
        let compile_context = optional(compile_context, place, "compile_context", as_str)?.unwrap_or("N/A");
        let user_metadata = optional(user_metadata, place, "user_metadata", as_str)?.unwrap_or("");
        Ok(TraceEntry {
            action,
            addr,
            size: required(size, place, "size", as_u64)?,
            stream: StreamId(optional(stream, place, "stream", as_u64)?.unwrap_or(0)),
            time_us: optional(time_us, place, "time_us", as_i64)?.unwrap_or(0),
            // An entry without the key had no context; `[]` is a context without Python frames.
            context: optional(frames, place, "frames", |v, p| self.stack(v, p))?,
            annotation: self.contexts.intern_annotation(compile_context, user_metadata),
        })
    }

    fn annotations(&mut self, value: &Value, place: &Place<'_>) -> Result<Vec<ExternalAnnotation>, PickleError> {
        let list = as_list(value, place)?;
        self.spend(list.len(), place)?;
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let place = place.index(i);
            let dict = as_dict(item, &place)?;
            let [stage, name, device, time_us] = fields(&dict, ["stage", "name", "device", "time_us"]);
            out.push(ExternalAnnotation {
                stage: optional(stage, &place, "stage", as_str)?.unwrap_or_default().to_owned(),
                name: optional(name, &place, "name", as_str)?.unwrap_or_default().to_owned(),
                device: optional(device, &place, "device", as_i64)?.unwrap_or(0),
                time_us: optional(time_us, &place, "time_us", as_i64)?.unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// A segment's or block's stack: `[]` (PyTorch's "none recorded") is `None`.
    fn stack_or_none(&mut self, value: &Value, place: &Place<'_>) -> Result<Option<ContextId>, PickleError> {
        if let Value::List(list) = value
            && list.inner().is_empty()
        {
            return Ok(None);
        }
        self.stack(value, place).map(Some)
    }

    /// Interns a frame list, converting each shared list only once.
    fn stack(&mut self, value: &Value, place: &Place<'_>) -> Result<ContextId, PickleError> {
        let Value::List(shared) = value else {
            return Err(expected(place, "a list of frames", value));
        };
        let identity = shared.rc_ptr() as usize;
        if let Some(&id) = self.stacks_by_identity.get(&identity) {
            return Ok(id);
        }
        let list = shared.inner();
        let mut frames = Vec::with_capacity(list.len());
        for (i, frame) in list.iter().enumerate() {
            frames.push(self.frame(frame, &place.index(i))?);
        }
        let id = self.contexts.intern(&frames);
        self.stacks_by_identity.insert(identity, id);
        Ok(id)
    }

    fn frame(&mut self, value: &Value, place: &Place<'_>) -> Result<Frame, PickleError> {
        let dict = as_dict(value, place)?;
        let [filename, line, name] = fields(&dict, ["filename", "line", "name"]);
        Ok(Frame {
            filename: self.name(required(filename, place, "filename", as_str)?),
            line: required(line, place, "line", as_i64)?,
            name: self.name(required(name, place, "name", as_str)?),
        })
    }

    fn name(&mut self, text: &str) -> Arc<str> {
        if let Some(name) = self.names.get(text) {
            return name.clone();
        }
        let name: Arc<str> = text.into();
        self.names.insert(name.clone());
        name
    }
}

fn pool_kind(value: &Value, place: &Place<'_>) -> Result<PoolKind, PickleError> {
    match as_str(value, place)? {
        "small" => Ok(PoolKind::Small),
        "large" => Ok(PoolKind::Large),
        other => Err(place.invalid(format!("unknown segment type {other:?} (expected \"small\" or \"large\")"))),
    }
}

fn pool_id(value: &Value, place: &Place<'_>) -> Result<(i64, i64), PickleError> {
    let pair = |items: &[Value]| match items {
        [a, b] => Ok((as_i64(a, &place.index(0))?, as_i64(b, &place.index(1))?)),
        _ => Err(place.invalid(format!("expected a pair, found {} items", items.len()))),
    };
    match value {
        Value::Tuple(t) => pair(t.inner()),
        Value::List(l) => pair(&l.inner()),
        other => Err(expected(place, "a tuple of two integers", other)),
    }
}

fn block_state(value: &Value, place: &Place<'_>) -> Result<BlockState, PickleError> {
    let name = as_str(value, place)?;
    BlockState::from_name(name).ok_or_else(|| {
        place.invalid(format!(
            "unknown block state {name:?} (expected \"active_allocated\", \"active_pending_free\" or \"inactive\")"
        ))
    })
}

fn settings(value: &Value, place: &Place<'_>) -> Result<TorchAllocatorSettings, PickleError> {
    let dict = as_dict(value, place)?;
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
    ] = fields(
        &dict,
        [
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size",
            "garbage_collection_threshold",
            "expandable_segments",
            "pinned_num_register_threads",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "graph_capture_record_stream_reuse",
            "roundup_power2_divisions",
        ],
    );
    // Missing keys get the values PyTorch reports for an empty configuration.
    Ok(TorchAllocatorSettings {
        settings: optional(conf, place, "PYTORCH_CUDA_ALLOC_CONF", as_str)?.unwrap_or("").to_owned(),
        max_split_size: optional(max_split_size, place, "max_split_size", |v, p| match v {
            // "Unlimited" written as SIZE_MAX rather than -1.
            Value::Int(big) if big.to_u64() == Some(u64::MAX) => Ok(-1),
            _ => as_i64(v, p),
        })?
        .unwrap_or(-1),
        garbage_collection_threshold: optional(gc_threshold, place, "garbage_collection_threshold", as_f64)?
            .unwrap_or(0.0),
        expandable_segments: optional(expandable, place, "expandable_segments", as_bool)?.unwrap_or(false),
        pinned_num_register_threads: optional(register_threads, place, "pinned_num_register_threads", as_i64)?
            .unwrap_or(1),
        release_lock_on_cudamalloc: optional(release_lock, place, "release_lock_on_cudamalloc", as_bool)?
            .unwrap_or(false),
        pinned_use_cuda_host_register: optional(host_register, place, "pinned_use_cuda_host_register", as_bool)?
            .unwrap_or(false),
        graph_capture_record_stream_reuse: optional(
            record_stream_reuse,
            place,
            "graph_capture_record_stream_reuse",
            as_bool,
        )?
        .unwrap_or(false),
        roundup_power2_divisions: optional(divisions, place, "roundup_power2_divisions", roundup_divisions)?
            .unwrap_or([0; ROUNDUP_INTERVALS]),
    })
}

fn roundup_divisions(value: &Value, place: &Place<'_>) -> Result<RoundupDivisions, PickleError> {
    let dict = as_dict(value, place)?;
    let mut divisions = [0; ROUNDUP_INTERVALS];
    for (key, value) in dict.iter() {
        let HashableValue::String(key) = key else {
            return Err(place.invalid("has a key that is not a string"));
        };
        let key = key.inner().as_str();
        let place = place.key(key);
        let Some(interval) = ROUNDUP_KEYS.iter().position(|k| *k == key) else {
            return Err(place.invalid("not an interval key (\"1\", \"2\", \"4\", ... \"32768\")"));
        };
        divisions[interval] = as_u64(value, &place)?;
    }
    Ok(divisions)
}
