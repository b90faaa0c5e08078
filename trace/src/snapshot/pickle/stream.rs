//! Streaming: opcodes → TorchSnapshot, without a value graph
//!
//! Runs the pickle machine beside the guard, but its values are the snapshot's own:
//! scalars stay on the stack (strings as places in the input), and each container is typed the
//! moment it is created by the role its parent gives it there (a trace entry, a stack, a
//! segment...). Python's pickler creates every container before its items and fills it at
//! once (`EMPTY_LIST`, then `MARK` items `APPENDS`, or one item and `APPEND`), so the role can
//! be read off the stack: the container that owns the innermost `MARK`, or the one just below.
//! An entry dict becomes a [`TraceEntry`] when it is appended to its trace, and its fields are
//! freed then, so memory follows the snapshot, not the pickle's value graph.
//!
//! Every role is checked again where the container is actually placed. When a pickle is laid
//! out otherwise (older protocols, other writers), or holds anything that is not what a
//! snapshot holds there, this reader stops with [`Unusual`] and the general reader (the
//! `pickled` crate's graph and [`super::Reader`]) reads the file instead: it gives the same
//! snapshot, or names the error and its place. So this reader never decides an error.
//!
//! Its result is used only when the [`super::Guard`] passes the pickle (then no container was
//! changed after it was placed, so each is complete when it is converted), but it runs on any
//! input without the guard's help, so the two can run at once: it never recurses or panics,
//! builds no graph, and its work and memory grow linearly with the input (every item is
//! converted where it is placed, each list, segment or entry at most once, and each frame
//! list interned once however often it is shared).

use super::*;
use cachalot_core::trace::AnnotationId;

/// The streaming reader handed the pickle over to the general one (see the module doc).
#[derive(Debug)]
pub(super) struct Unusual;

type Flow<T> = Result<T, Unusual>;

/// A value on the machine's stack or in its memo: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX` that fits in 64 bits unsigned.
    Big(u64),
    /// Any other integer, or bytes: nothing a snapshot field can hold.
    Opaque,
    Float(f64),
    /// A string: its place in the input.
    Str {
        start: u32,
        len: u32,
    },
    /// A container: index into [`Stream::nodes`].
    Node(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    List,
    Dict,
    Tuple,
}

/// What a container is in the snapshot, read from where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The snapshot dict.
    Root,
    Segments,
    Segment,
    Blocks,
    Block,
    /// A frame list (`frames` of a segment, block or entry).
    Stack,
    Frame,
    DeviceTraces,
    Trace,
    Entry,
    Settings,
    Divisions,
    Annotations,
    Annotation,
    /// `segment_pool_id`: a tuple (or list) of two integers.
    PoolId,
    /// Under a key the snapshot does not read: kept nowhere.
    Ignored,
}

const ROOT_FIELDS: &[&str] = &["segments", "device_traces", "allocator_settings", "external_annotations"];
const SEGMENT_FIELDS: &[&str] = &[
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
];
const BLOCK_FIELDS: &[&str] = &["address", "size", "requested_size", "state", "frames"];
const ENTRY_FIELDS: &[&str] =
    &["action", "addr", "device_free", "size", "stream", "time_us", "frames", "compile_context", "user_metadata"];
const FRAME_FIELDS: &[&str] = &["filename", "line", "name"];
const ANNOTATION_FIELDS: &[&str] = &["stage", "name", "device", "time_us"];
const SETTINGS_FIELDS: &[&str] = &[
    "PYTORCH_CUDA_ALLOC_CONF",
    "max_split_size",
    "garbage_collection_threshold",
    "expandable_segments",
    "pinned_num_register_threads",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "graph_capture_record_stream_reuse",
    "roundup_power2_divisions",
];

/// The most fields any dict role reads (`roundup_power2_divisions`' 16 intervals).
const MAX_FIELDS: usize = ROUNDUP_INTERVALS;

impl Role {
    /// The kind of container the role must be.
    fn accepts(self, kind: Kind) -> bool {
        match self {
            Role::Root
            | Role::Segment
            | Role::Block
            | Role::Frame
            | Role::Entry
            | Role::Settings
            | Role::Divisions
            | Role::Annotation => kind == Kind::Dict,
            Role::Segments | Role::Blocks | Role::Stack | Role::DeviceTraces | Role::Trace | Role::Annotations => {
                kind == Kind::List
            }
            Role::PoolId => kind != Kind::Dict,
            Role::Ignored => true,
        }
    }

    /// The keys a dict role reads, in field order.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Role::Root => ROOT_FIELDS,
            Role::Segment => SEGMENT_FIELDS,
            Role::Block => BLOCK_FIELDS,
            Role::Entry => ENTRY_FIELDS,
            Role::Frame => FRAME_FIELDS,
            Role::Annotation => ANNOTATION_FIELDS,
            Role::Settings => SETTINGS_FIELDS,
            Role::Divisions => &ROUNDUP_KEYS,
            _ => &[],
        }
    }

    /// The role of the items of a list (or tuple) of this role.
    fn item(self) -> Role {
        match self {
            Role::Segments => Role::Segment,
            Role::Blocks => Role::Block,
            Role::Stack => Role::Frame,
            Role::DeviceTraces => Role::Trace,
            Role::Trace => Role::Entry,
            Role::Annotations => Role::Annotation,
            _ => Role::Ignored,
        }
    }

    /// The role of the value of field `field` (an index into [`Role::fields`]) of this role.
    fn field(self, field: Option<usize>) -> Role {
        let Some(field) = field else { return Role::Ignored };
        match (self, self.fields()[field]) {
            (Role::Root, "segments") => Role::Segments,
            (Role::Root, "device_traces") => Role::DeviceTraces,
            (Role::Root, "allocator_settings") => Role::Settings,
            (Role::Root, "external_annotations") => Role::Annotations,
            (Role::Segment, "segment_pool_id") => Role::PoolId,
            (Role::Segment, "blocks") => Role::Blocks,
            (Role::Segment | Role::Block | Role::Entry, "frames") => Role::Stack,
            (Role::Settings, "roundup_power2_divisions") => Role::Divisions,
            _ => Role::Ignored,
        }
    }
}

/// A block before its segment fills in a missing address.
struct PendingBlock {
    address: Option<u64>,
    size: u64,
    requested_size: u64,
    state: BlockState,
    frames: Option<ContextId>,
}

/// What a container holds so far.
enum Data {
    /// Ignored, not begun, or already moved into its parent.
    Nothing,
    /// A dict role's fields, by index into [`Role::fields`].
    Fields(Box<[Option<Val>; MAX_FIELDS]>),
    Segments(Vec<TorchSegment>),
    Blocks(Vec<PendingBlock>),
    /// A frame list until it is first used, then its interned id (shared lists stay shared).
    Frames(Vec<Frame>),
    Interned(ContextId),
    /// A frame dict after its first use (frame dicts are shared between stacks too).
    Frame(Box<Frame>),
    Traces(Vec<Vec<TraceEntry>>),
    Trace(Vec<TraceEntry>),
    Annotations(Vec<ExternalAnnotation>),
    Items(Vec<Val>),
}

struct Node {
    kind: Kind,
    role: Role,
    data: Data,
}

/// A small cache of which field a key string names, by the key's place in the input: the
/// pickler memoises each key once, so nearly every lookup is the same few places.
#[derive(Clone, Copy)]
struct KeyHit {
    start: u32,
    role: Role,
    field: Option<u8>,
    /// The role of the value under this key.
    child: Role,
}

const KEY_CACHE: usize = 256;

pub(super) struct Stream<'b> {
    bytes: &'b [u8],
    pos: usize,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    nodes: Vec<Node>,
    scratch: Vec<Val>,
    /// Field boxes of dicts already converted, reused: one allocation per dict alive at once,
    /// not per dict.
    #[allow(clippy::vec_box, reason = "the boxes move in and out of `Data::Fields`, which they keep small")]
    spare: Vec<Box<[Option<Val>; MAX_FIELDS]>>,
    keys: [Option<KeyHit>; KEY_CACHE],
    /// Stacks and annotations in the order this reader meets them; [`Stream::finish`]
    /// re-interns them in the general reader's order so the ids come out the same.
    contexts: ContextTable,
    names: FxHashSet<Arc<str>>,
}

/// Reads `bytes` (a pickle the guard passed, up to its STOP) into a snapshot; `input_len` is
/// the whole input's length, the budget of elements (as the general reader's).
pub(super) fn read(bytes: &[u8], input_len: usize) -> Flow<TorchSnapshot> {
    // Places in the input are kept as `u32`; protocols 0 and 1 are left to the general reader.
    if u32::try_from(bytes.len()).is_err() || bytes.get(..2).is_none_or(|p| p[0] != op::PROTO || p[1] < 2) {
        return Err(Unusual);
    }
    let mut stream = Stream {
        bytes,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        nodes: Vec::new(),
        scratch: Vec::new(),
        spare: Vec::new(),
        keys: [None; KEY_CACHE],
        contexts: ContextTable::default(),
        names: FxHashSet::default(),
    };
    let root = stream.run()?;
    let snapshot = stream.root(root)?;
    finish(snapshot, input_len)
}

impl<'b> Stream<'b> {
    fn take(&mut self, n: usize) -> Flow<&'b [u8]> {
        let end = self.pos.checked_add(n).ok_or(Unusual)?;
        let slice = self.bytes.get(self.pos..end).ok_or(Unusual)?;
        self.pos = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Flow<[u8; N]> {
        let slice = self.take(N)?;
        let mut array = [0; N];
        array.copy_from_slice(slice);
        Ok(array)
    }

    fn string(&mut self, len: usize) -> Flow<Val> {
        let start = self.pos;
        self.take(len)?;
        // The guard checked the UTF-8; the input is shorter than 4 GiB (checked in `read`).
        Ok(Val::Str { start: start as u32, len: len as u32 })
    }

    fn text(&self, val: Val) -> Flow<&'b str> {
        match val {
            Val::Str { start, len } => {
                let start = start as usize;
                let bytes = self.bytes.get(start..start + len as usize).ok_or(Unusual)?;
                std::str::from_utf8(bytes).map_err(|_| Unusual)
            }
            _ => Err(Unusual),
        }
    }

    /// A little-endian two's-complement integer (`LONG1`, `LONG4`).
    fn long(&mut self, len: usize) -> Flow<Val> {
        let bytes = self.take(len)?;
        if len > 16 {
            return Ok(Val::Opaque);
        }
        let Some(&last) = bytes.last() else { return Ok(Val::Int(0)) };
        let mut value: i128 = if last & 0x80 != 0 { -1 } else { 0 };
        for &b in bytes.iter().rev() {
            value = (value << 8) | i128::from(b);
        }
        Ok(match (i64::try_from(value), u64::try_from(value)) {
            (Ok(i), _) => Val::Int(i),
            (_, Ok(u)) => Val::Big(u),
            _ => Val::Opaque,
        })
    }

    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Flow<Val> {
        if self.stack.len() <= self.base() {
            return Err(Unusual);
        }
        self.stack.pop().ok_or(Unusual)
    }

    fn top(&self) -> Flow<Val> {
        if self.stack.len() <= self.base() {
            return Err(Unusual);
        }
        self.stack.last().copied().ok_or(Unusual)
    }

    /// APPENDS and SETITEMS: closes the innermost MARK and runs `fill` on the container below
    /// it with the items above it, read in place, then drops them.
    fn marked(&mut self, fill: fn(&mut Self, Val, &[Val]) -> Flow<()>) -> Flow<()> {
        let mark = self.marks.pop().ok_or(Unusual)?;
        if mark == 0 || mark - 1 < self.base() || mark > self.stack.len() {
            return Err(Unusual);
        }
        let target = self.stack[mark - 1];
        let mut stack = std::mem::take(&mut self.stack);
        let result = fill(self, target, &stack[mark..]);
        stack.truncate(mark);
        self.stack = stack;
        result
    }

    /// Moves the items above the innermost MARK into the scratch buffer.
    fn pop_mark(&mut self) -> Flow<Vec<Val>> {
        let mark = self.marks.pop().ok_or(Unusual)?;
        self.pop_from(mark)
    }

    fn pop_from(&mut self, start: usize) -> Flow<Vec<Val>> {
        if start > self.stack.len() {
            return Err(Unusual);
        }
        let mut items = std::mem::take(&mut self.scratch);
        items.clear();
        items.extend(self.stack.drain(start..));
        Ok(items)
    }

    fn node(&self, val: Val) -> Option<&Node> {
        match val {
            Val::Node(i) => self.nodes.get(i as usize),
            _ => None,
        }
    }

    /// Which field of `role` the key `key` names (`None`: one the snapshot does not read), and
    /// the role of the value under it.
    fn field_and_role(&mut self, role: Role, key: Val) -> Flow<(Option<usize>, Role)> {
        let Val::Str { start, .. } = key else {
            // Only string keys are fields; the intervals dict has nothing but.
            return if role == Role::Divisions { Err(Unusual) } else { Ok((None, Role::Ignored)) };
        };
        let slot = start as usize % KEY_CACHE;
        if let Some(hit) = self.keys[slot]
            && hit.start == start
            && hit.role == role
        {
            return Ok((hit.field.map(usize::from), hit.child));
        }
        let text = self.text(key)?;
        let field = role.fields().iter().position(|name| *name == text);
        if role == Role::Divisions && field.is_none() {
            return Err(Unusual);
        }
        let child = role.field(field);
        self.keys[slot] = Some(KeyHit { start, role, field: field.map(|f| f as u8), child });
        Ok((field, child))
    }

    /// The role a container created now gets: as an item of the container just below it on
    /// the stack (one `APPEND`/`SETITEM`), or of the container that owns the innermost MARK.
    fn infer(&mut self, kind: Kind) -> Flow<Role> {
        if self.stack.is_empty() && self.marks.is_empty() {
            return Ok(match kind {
                Kind::Dict => Role::Root,
                Kind::List => Role::Segments,
                Kind::Tuple => Role::Ignored,
            });
        }
        let base = self.base();
        let above = self.stack.len() - base;
        let len = self.stack.len();
        let mut below = None;
        if above >= 1 {
            let top = self.stack[len - 1];
            if let Some(node) = self.node(top)
                && node.kind == Kind::List
            {
                below = Some(node.role.item());
            } else if above >= 2
                && let Some(node) = self.node(self.stack[len - 2])
                && node.kind == Kind::Dict
                && matches!(top, Val::Str { .. })
            {
                let role = node.role;
                below = Some(self.field_and_role(role, top)?.1);
            }
        }
        let mut owner = None;
        if !self.marks.is_empty()
            && base >= 1
            && let Some(node) = self.node(self.stack[base - 1])
        {
            let role = node.role;
            match node.kind {
                Kind::List => owner = Some(role.item()),
                Kind::Dict if above % 2 == 1 => owner = Some(self.field_and_role(role, self.stack[len - 1])?.1),
                _ => {}
            }
        }
        let fits = |role: &Role| *role != Role::Ignored && role.accepts(kind);
        Ok(below.filter(fits).or(owner.filter(fits)).unwrap_or(Role::Ignored))
    }

    fn new_node(&mut self, kind: Kind) -> Flow<u32> {
        let role = self.infer(kind)?;
        let data = match role {
            Role::Root
            | Role::Segment
            | Role::Block
            | Role::Frame
            | Role::Entry
            | Role::Settings
            | Role::Divisions
            | Role::Annotation => Data::Fields(self.spare.pop().unwrap_or_else(|| Box::new([None; MAX_FIELDS]))),
            Role::Segments => Data::Segments(Vec::new()),
            Role::Blocks => Data::Blocks(Vec::new()),
            Role::Stack => Data::Frames(Vec::new()),
            Role::DeviceTraces => Data::Traces(Vec::new()),
            Role::Trace => Data::Trace(Vec::new()),
            Role::Annotations => Data::Annotations(Vec::new()),
            Role::PoolId => Data::Items(Vec::new()),
            Role::Ignored => Data::Nothing,
        };
        let index = u32::try_from(self.nodes.len()).map_err(|_| Unusual)?;
        self.nodes.push(Node { kind, role, data });
        Ok(index)
    }

    /// Checks that `item`, placed where a value of `role` belongs, was typed as that.
    fn check_role(&self, item: Val, role: Role) -> Flow<()> {
        match self.node(item) {
            Some(node) if node.role != role && role != Role::Ignored => Err(Unusual),
            _ => Ok(()),
        }
    }

    /// APPEND(S), or the items of LIST or a tuple: `items` go into `target`.
    fn append(&mut self, target: Val, items: &[Val]) -> Flow<()> {
        let Val::Node(index) = target else { return Err(Unusual) };
        let (kind, role) = self.node(target).map(|n| (n.kind, n.role)).ok_or(Unusual)?;
        if kind == Kind::Dict {
            return Err(Unusual);
        }
        let item_role = role.item();
        for &item in items {
            self.check_role(item, item_role)?;
        }
        // Take the list's data out while its items are converted (they may be nodes too).
        let mut data = std::mem::replace(&mut self.nodes[index as usize].data, Data::Nothing);
        let result = (|| -> Flow<()> {
            match &mut data {
                Data::Nothing => {}
                Data::Segments(segments) => {
                    for &item in items {
                        segments.push(self.segment(item)?);
                    }
                }
                Data::Blocks(blocks) => {
                    for &item in items {
                        blocks.push(self.block(item)?);
                    }
                }
                Data::Frames(frames) => {
                    for &item in items {
                        frames.push(self.frame(item)?);
                    }
                }
                Data::Traces(traces) => {
                    for &item in items {
                        match self.take_data(item)? {
                            Data::Trace(trace) => traces.push(trace),
                            _ => return Err(Unusual),
                        }
                    }
                }
                Data::Trace(trace) => {
                    trace.reserve(items.len());
                    for &item in items {
                        trace.push(self.entry(item)?);
                    }
                }
                Data::Annotations(annotations) => {
                    for &item in items {
                        annotations.push(self.annotation(item)?);
                    }
                }
                Data::Items(values) => values.extend_from_slice(items),
                // A frame list already used (then changed: the guard refuses that), or a
                // dict's data on a list.
                _ => return Err(Unusual),
            }
            Ok(())
        })();
        self.nodes[index as usize].data = data;
        result
    }

    /// SETITEM(S), or the items of DICT: `pairs` (key, value, key, value...) go into `target`.
    fn set_items(&mut self, target: Val, pairs: &[Val]) -> Flow<()> {
        let Val::Node(index) = target else { return Err(Unusual) };
        let (kind, role) = self.node(target).map(|n| (n.kind, n.role)).ok_or(Unusual)?;
        if kind != Kind::Dict || !pairs.len().is_multiple_of(2) {
            return Err(Unusual);
        }
        if role == Role::Ignored {
            return Ok(());
        }
        for pair in pairs.chunks_exact(2) {
            let (field, child) = self.field_and_role(role, pair[0])?;
            self.check_role(pair[1], child)?;
            let Some(field) = field else { continue };
            let Data::Fields(fields) = &mut self.nodes[index as usize].data else { return Err(Unusual) };
            // A key given twice: the general reader decides which one counts.
            if fields[field].replace(pair[1]).is_some() {
                return Err(Unusual);
            }
        }
        Ok(())
    }

    /// Moves a node's data out (each list, segment or entry is converted once).
    fn take_data(&mut self, val: Val) -> Flow<Data> {
        let Val::Node(index) = val else { return Err(Unusual) };
        let node = self.nodes.get_mut(index as usize).ok_or(Unusual)?;
        match std::mem::replace(&mut node.data, Data::Nothing) {
            Data::Nothing => Err(Unusual),
            data => Ok(data),
        }
    }

    /// A dict's fields, moved out; its box goes back to [`Stream::spare`] for the next dict.
    fn fields(&mut self, val: Val, role: Role) -> Flow<[Option<Val>; MAX_FIELDS]> {
        if self.node(val).is_none_or(|n| n.role != role || n.kind != Kind::Dict) {
            return Err(Unusual);
        }
        match self.take_data(val)? {
            Data::Fields(mut boxed) => {
                let fields = std::mem::replace(&mut *boxed, [None; MAX_FIELDS]);
                self.spare.push(boxed);
                Ok(fields)
            }
            _ => Err(Unusual),
        }
    }

    fn u64(&self, val: Option<Val>) -> Flow<Option<u64>> {
        match val {
            None => Ok(None),
            Some(Val::Int(i)) => u64::try_from(i).map(Some).map_err(|_| Unusual),
            Some(Val::Big(u)) => Ok(Some(u)),
            Some(_) => Err(Unusual),
        }
    }

    fn i64(&self, val: Option<Val>) -> Flow<Option<i64>> {
        match val {
            None => Ok(None),
            Some(Val::Int(i)) => Ok(Some(i)),
            Some(_) => Err(Unusual),
        }
    }

    fn f64(&self, val: Option<Val>) -> Flow<Option<f64>> {
        match val {
            None => Ok(None),
            Some(Val::Float(f)) => Ok(Some(f)),
            Some(Val::Int(i)) => Ok(Some(i as f64)),
            Some(_) => Err(Unusual),
        }
    }

    fn bool(&self, val: Option<Val>) -> Flow<Option<bool>> {
        match val {
            None => Ok(None),
            Some(Val::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(Unusual),
        }
    }

    fn str(&self, val: Option<Val>) -> Flow<Option<&'b str>> {
        val.map(|v| self.text(v)).transpose()
    }

    /// A frame list: interned once, by the list (its memo identity).
    fn stack_id(&mut self, val: Val) -> Flow<ContextId> {
        let Val::Node(index) = val else { return Err(Unusual) };
        let node = self.nodes.get_mut(index as usize).ok_or(Unusual)?;
        if node.role != Role::Stack || node.kind != Kind::List {
            return Err(Unusual);
        }
        let id = match &node.data {
            Data::Interned(id) => *id,
            Data::Frames(frames) => self.contexts.intern(frames),
            _ => return Err(Unusual),
        };
        node.data = Data::Interned(id);
        Ok(id)
    }

    /// A segment's or block's stack: `[]` (PyTorch's "none recorded") is `None`.
    fn stack_or_none(&mut self, val: Option<Val>) -> Flow<Option<ContextId>> {
        let Some(val) = val else { return Ok(None) };
        let empty = match self.node(val).map(|n| &n.data) {
            Some(Data::Frames(frames)) => frames.is_empty(),
            Some(Data::Interned(id)) => self.contexts.frames(*id).is_empty(),
            _ => return Err(Unusual),
        };
        if empty { Ok(None) } else { self.stack_id(val).map(Some) }
    }

    fn frame(&mut self, val: Val) -> Flow<Frame> {
        if let Some(Node { data: Data::Frame(frame), role: Role::Frame, .. }) = self.node(val) {
            return Ok(Frame::clone(frame));
        }
        let [filename, line, name, ..] = self.fields(val, Role::Frame)?;
        let frame = Frame {
            filename: self.name(self.str(filename)?.ok_or(Unusual)?),
            line: self.i64(line)?.ok_or(Unusual)?,
            name: self.name(self.str(name)?.ok_or(Unusual)?),
        };
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

    fn entry(&mut self, val: Val) -> Flow<TraceEntry> {
        let [action, addr, device_free, size, stream, time_us, frames, compile_context, user_metadata, ..] =
            self.fields(val, Role::Entry)?;
        let action = TraceAction::from_name(self.str(action)?.ok_or(Unusual)?).ok_or(Unusual)?;
        // An `oom` entry keeps the device's free bytes under `device_free` instead of `addr`.
        let addr = match (action, device_free) {
            (TraceAction::Oom, Some(free)) => self.u64(Some(free))?,
            _ => self.u64(addr)?,
        }
        .ok_or(Unusual)?;
        let compile_context = self.str(compile_context)?.unwrap_or("N/A");
        let user_metadata = self.str(user_metadata)?.unwrap_or("");
        Ok(TraceEntry {
            action,
            addr,
            size: self.u64(size)?.ok_or(Unusual)?,
            stream: StreamId(self.u64(stream)?.unwrap_or(0)),
            time_us: self.i64(time_us)?.unwrap_or(0),
            context: frames.map(|f| self.stack_id(f)).transpose()?,
            annotation: self.contexts.intern_annotation(compile_context, user_metadata),
        })
    }

    fn block(&mut self, val: Val) -> Flow<PendingBlock> {
        let [address, size, requested_size, state, frames, ..] = self.fields(val, Role::Block)?;
        let size = self.u64(size)?.ok_or(Unusual)?;
        Ok(PendingBlock {
            address: self.u64(address)?,
            size,
            requested_size: self.u64(requested_size)?.unwrap_or(size),
            state: BlockState::from_name(self.str(state)?.ok_or(Unusual)?).ok_or(Unusual)?,
            frames: self.stack_or_none(frames)?,
        })
    }

    fn segment(&mut self, val: Val) -> Flow<TorchSegment> {
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
        ] = self.fields(val, Role::Segment)?;
        let address = self.u64(address)?.ok_or(Unusual)?;
        let total_size = self.u64(total_size)?.ok_or(Unusual)?;
        let frames = self.stack_or_none(frames)?;
        let Data::Blocks(pending) = self.take_data(blocks.ok_or(Unusual)?)? else { return Err(Unusual) };
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
        let segment_type = match self.str(segment_type)? {
            None if total_size <= SMALL_BUFFER => PoolKind::Small,
            None => PoolKind::Large,
            Some("small") => PoolKind::Small,
            Some("large") => PoolKind::Large,
            Some(_) => return Err(Unusual),
        };
        let segment_pool_id = match segment_pool_id {
            None => (0, 0),
            // Read in place: one tuple may be shared by many segments.
            Some(pair) => match self.node(pair).map(|n| &n.data) {
                Some(Data::Items(items)) => match items[..] {
                    [a, b] => (self.i64(Some(a))?.ok_or(Unusual)?, self.i64(Some(b))?.ok_or(Unusual)?),
                    _ => return Err(Unusual),
                },
                _ => return Err(Unusual),
            },
        };
        Ok(TorchSegment {
            device: self.i64(device)?.unwrap_or(0),
            address,
            total_size,
            allocated_size: match self.u64(allocated_size)? {
                Some(size) => size,
                None => sum(|s| s == BlockState::ActiveAllocated, |b| b.size),
            },
            active_size: match self.u64(active_size)? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.size),
            },
            requested_size: match self.u64(requested_size)? {
                Some(size) => size,
                None => sum(|s| s != BlockState::Inactive, |b| b.requested_size),
            },
            stream: self.u64(stream)?.unwrap_or(0),
            segment_type,
            segment_pool_id,
            is_expandable: self.bool(is_expandable)?.unwrap_or(false),
            frames,
            blocks,
        })
    }

    fn annotation(&mut self, val: Val) -> Flow<ExternalAnnotation> {
        let [stage, name, device, time_us, ..] = self.fields(val, Role::Annotation)?;
        Ok(ExternalAnnotation {
            stage: self.str(stage)?.unwrap_or_default().to_owned(),
            name: self.str(name)?.unwrap_or_default().to_owned(),
            device: self.i64(device)?.unwrap_or(0),
            time_us: self.i64(time_us)?.unwrap_or(0),
        })
    }

    fn settings(&mut self, val: Val) -> Flow<TorchAllocatorSettings> {
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
        ] = self.fields(val, Role::Settings)?;
        let roundup_power2_divisions = match divisions {
            None => [0; ROUNDUP_INTERVALS],
            Some(divisions) => {
                let values = self.fields(divisions, Role::Divisions)?;
                let mut out = [0; ROUNDUP_INTERVALS];
                for (slot, value) in out.iter_mut().zip(values.iter()) {
                    *slot = self.u64(*value)?.unwrap_or(0);
                }
                out
            }
        };
        // Missing keys get the values PyTorch reports for an empty configuration.
        Ok(TorchAllocatorSettings {
            settings: self.str(conf)?.unwrap_or("").to_owned(),
            max_split_size: match max_split_size {
                // "Unlimited" written as SIZE_MAX rather than -1.
                Some(Val::Big(u64::MAX)) => -1,
                other => self.i64(other)?.unwrap_or(-1),
            },
            garbage_collection_threshold: self.f64(gc_threshold)?.unwrap_or(0.0),
            expandable_segments: self.bool(expandable)?.unwrap_or(false),
            pinned_num_register_threads: self.i64(register_threads)?.unwrap_or(1),
            release_lock_on_cudamalloc: self.bool(release_lock)?.unwrap_or(false),
            pinned_use_cuda_host_register: self.bool(host_register)?.unwrap_or(false),
            graph_capture_record_stream_reuse: self.bool(record_stream_reuse)?.unwrap_or(false),
            roundup_power2_divisions,
        })
    }

    fn root(&mut self, root: Val) -> Flow<TorchSnapshot> {
        let node = self.node(root).ok_or(Unusual)?;
        if node.role == Role::Segments {
            let Data::Segments(segments) = self.take_data(root)? else { return Err(Unusual) };
            return Ok(TorchSnapshot {
                segments,
                contexts: std::mem::take(&mut self.contexts),
                ..TorchSnapshot::default()
            });
        }
        let [segments, device_traces, allocator_settings, external_annotations, ..] = self.fields(root, Role::Root)?;
        let Data::Segments(segments) = self.take_data(segments.ok_or(Unusual)?)? else { return Err(Unusual) };
        let device_traces = match device_traces {
            None => Vec::new(),
            Some(traces) => match self.take_data(traces)? {
                Data::Traces(traces) => traces,
                _ => return Err(Unusual),
            },
        };
        let allocator_settings = allocator_settings.map(|s| self.settings(s)).transpose()?;
        let external_annotations = match external_annotations {
            None => Vec::new(),
            Some(annotations) => match self.take_data(annotations)? {
                Data::Annotations(annotations) => annotations,
                _ => return Err(Unusual),
            },
        };
        Ok(TorchSnapshot {
            segments,
            device_traces,
            allocator_settings,
            external_annotations,
            contexts: std::mem::take(&mut self.contexts),
        })
    }

    fn memo_put(&mut self, id: usize) -> Flow<()> {
        let top = self.top()?;
        if id >= self.bytes.len() {
            return Err(Unusual);
        }
        if id >= self.memo.len() {
            self.memo.resize(id + 1, None);
        }
        self.memo[id] = Some(top);
        Ok(())
    }

    fn memo_get(&mut self, id: usize) -> Flow<()> {
        let val = self.memo.get(id).copied().flatten().ok_or(Unusual)?;
        self.stack.push(val);
        Ok(())
    }

    fn push_node(&mut self, kind: Kind) -> Flow<Val> {
        let node = Val::Node(self.new_node(kind)?);
        self.stack.push(node);
        Ok(node)
    }

    /// Runs the machine to STOP; returns the value it leaves.
    fn run(&mut self) -> Flow<Val> {
        loop {
            let [code] = self.take_array()?;
            match code {
                op::PROTO => {
                    self.take(1)?;
                }
                op::FRAME => {
                    self.take(8)?;
                }
                op::STOP => return self.pop(),
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else {
                        let mark = self.marks.pop().ok_or(Unusual)?;
                        self.stack.truncate(mark);
                    }
                }
                op::POP_MARK => {
                    let mark = self.marks.pop().ok_or(Unusual)?;
                    self.stack.truncate(mark);
                }
                op::DUP => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                op::BINPUT => {
                    let [id] = self.take_array()?;
                    self.memo_put(id.into())?;
                }
                op::LONG_BINPUT => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_put(id as usize)?;
                }
                op::MEMOIZE => self.memo_put(self.memo.len())?,
                op::BINGET => {
                    let [id] = self.take_array()?;
                    self.memo_get(id.into())?;
                }
                op::LONG_BINGET => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_get(id as usize)?;
                }
                op::NONE => self.stack.push(Val::None),
                op::NEWTRUE => self.stack.push(Val::Bool(true)),
                op::NEWFALSE => self.stack.push(Val::Bool(false)),
                op::BININT1 => {
                    let [b] = self.take_array()?;
                    self.stack.push(Val::Int(b.into()));
                }
                op::BININT2 => {
                    let v = u16::from_le_bytes(self.take_array()?);
                    self.stack.push(Val::Int(v.into()));
                }
                op::BININT => {
                    let v = i32::from_le_bytes(self.take_array()?);
                    self.stack.push(Val::Int(v.into()));
                }
                op::LONG1 => {
                    let [n] = self.take_array()?;
                    let val = self.long(n.into())?;
                    self.stack.push(val);
                }
                op::LONG4 => {
                    let n = usize::try_from(i32::from_le_bytes(self.take_array()?)).map_err(|_| Unusual)?;
                    let val = self.long(n)?;
                    self.stack.push(val);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.stack.push(Val::Float(v));
                }
                op::SHORT_BINUNICODE => {
                    let [n] = self.take_array()?;
                    let val = self.string(n.into())?;
                    self.stack.push(val);
                }
                op::BINUNICODE => {
                    let n = u32::from_le_bytes(self.take_array()?);
                    let val = self.string(n as usize)?;
                    self.stack.push(val);
                }
                op::BINUNICODE8 => {
                    let n = usize::try_from(u64::from_le_bytes(self.take_array()?)).map_err(|_| Unusual)?;
                    let val = self.string(n)?;
                    self.stack.push(val);
                }
                op::SHORT_BINBYTES => {
                    let [n] = self.take_array()?;
                    self.take(n.into())?;
                    self.stack.push(Val::Opaque);
                }
                op::BINBYTES => {
                    let n = u32::from_le_bytes(self.take_array()?);
                    self.take(n as usize)?;
                    self.stack.push(Val::Opaque);
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = usize::try_from(u64::from_le_bytes(self.take_array()?)).map_err(|_| Unusual)?;
                    self.take(n)?;
                    self.stack.push(Val::Opaque);
                }
                op::EMPTY_LIST => {
                    self.push_node(Kind::List)?;
                }
                op::EMPTY_DICT => {
                    self.push_node(Kind::Dict)?;
                }
                op::EMPTY_TUPLE => {
                    self.push_node(Kind::Tuple)?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    let target = self.top()?;
                    self.append(target, &[item])?;
                }
                op::APPENDS => self.marked(Self::append)?,
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let target = self.top()?;
                    self.set_items(target, &[key, value])?;
                }
                op::SETITEMS => self.marked(Self::set_items)?,
                op::LIST | op::DICT | op::TUPLE | op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let items = match code {
                        op::LIST | op::DICT | op::TUPLE => self.pop_mark()?,
                        _ => {
                            let n = usize::from(code - op::TUPLE1) + 1;
                            if self.stack.len() < self.base() + n {
                                return Err(Unusual);
                            }
                            self.pop_from(self.stack.len() - n)?
                        }
                    };
                    let kind = match code {
                        op::LIST => Kind::List,
                        op::DICT => Kind::Dict,
                        _ => Kind::Tuple,
                    };
                    let result = self.push_node(kind).and_then(|node| match kind {
                        Kind::Dict => self.set_items(node, &items),
                        _ => self.append(node, &items),
                    });
                    self.scratch = items;
                    result?;
                }
                // Text opcodes (protocols 0 and 1), sets, objects: the general reader's.
                _ => return Err(Unusual),
            }
        }
    }
}

/// Checks the element budget and gives the stacks and annotations the ids the general reader
/// gives them: it interns in field order (segments, then traces), this reader in file order.
fn finish(mut snapshot: TorchSnapshot, input_len: usize) -> Flow<TorchSnapshot> {
    let elements = snapshot.segments.len()
        + snapshot.segments.iter().map(|s| s.blocks.len()).sum::<usize>()
        + snapshot.device_traces.iter().map(Vec::len).sum::<usize>()
        + snapshot.external_annotations.len();
    if elements > input_len {
        return Err(Unusual);
    }
    let local = std::mem::take(&mut snapshot.contexts);
    let mut table = ContextTable::default();
    let mut stacks: Vec<Option<ContextId>> = vec![None; local.stacks().len()];
    let mut annotations: Vec<Option<AnnotationId>> = vec![None; local.annotations().len()];
    let mut stack = |id: &mut Option<ContextId>, table: &mut ContextTable| {
        if let Some(old) = id {
            let slot = &mut stacks[old.0 as usize];
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
        if let Some(old) = entry.annotation {
            let slot = &mut annotations[old.0 as usize];
            if slot.is_none() {
                let a = local.annotation(old).ok_or(Unusual)?;
                *slot = table.intern_annotation(&a.compile_context, &a.user_metadata);
            }
            entry.annotation = *slot;
        }
    }
    snapshot.contexts = table;
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/traces/pytorch-2.11-h200");

    fn references() -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(TRACES)
            .expect("testdata/traces of the repository")
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect();
        paths.sort();
        assert_eq!(paths.len(), 9, "the nine reference snapshots");
        paths
    }

    fn guarded(bytes: &[u8]) -> usize {
        Guard::new(bytes).scan().expect("the guard passes it")
    }

    /// The general reader's snapshot (the `pickled` graph, converted by `Reader`).
    fn graph(bytes: &[u8]) -> Result<TorchSnapshot, PickleError> {
        read_snapshot_general(bytes)
    }

    fn streamed(bytes: &[u8], name: &str) -> TorchSnapshot {
        read(&bytes[..guarded(bytes)], bytes.len()).unwrap_or_else(|_| panic!("{name}: the streaming reader gave up"))
    }

    fn assert_same(a: &TorchSnapshot, b: &TorchSnapshot, name: &str) {
        assert_eq!(a.segments, b.segments, "{name}: segments");
        assert_eq!(a.device_traces, b.device_traces, "{name}: device traces");
        assert_eq!(a.allocator_settings, b.allocator_settings, "{name}: settings");
        assert_eq!(a.external_annotations, b.external_annotations, "{name}: annotations");
        assert_eq!(a.contexts.stacks(), b.contexts.stacks(), "{name}: stacks");
        assert_eq!(a.contexts.annotations(), b.contexts.annotations(), "{name}: annotation strings");
    }

    #[test]
    fn every_reference_pickle_streams_to_the_general_readers_snapshot() {
        for path in references() {
            let name = path.display().to_string();
            let bytes = std::fs::read(&path).expect("reads");
            let expected = graph(&bytes).expect("the general reader reads it");
            assert_same(&streamed(&bytes, &name), &expected, &name);
            // What we write streams too (our writer's layout is Python's).
            let written = write_snapshot(&expected).expect("writes");
            assert_same(&streamed(&written, &name), &expected, &format!("{name}, written back"));
        }
    }

    #[test]
    fn python_protocols_2_to_5_stream_and_0_and_1_take_the_general_reader() {
        let seeds = std::fs::read(Path::new(TRACES).join("seeds.pickle")).expect("reads");
        let expected = graph(&seeds).expect("reads");
        for protocol in 0..=5 {
            if protocol == 4 {
                continue; // PyTorch's own file, above.
            }
            let path =
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/seeds.protocol{protocol}.pickle"));
            let bytes = std::fs::read(&path).expect("the fixture");
            let via_stream = read(&bytes[..guarded(&bytes)], bytes.len());
            assert_eq!(via_stream.is_ok(), protocol >= 2, "protocol {protocol}");
            let snapshot = read_snapshot(&bytes).expect("reads");
            assert_same(&snapshot, &expected, &format!("protocol {protocol}"));
        }
    }

    #[test]
    fn a_memoised_frame_list_is_interned_once_and_its_frames_shared() {
        let bytes = std::fs::read(Path::new(TRACES).join("gpt_train.pickle")).expect("reads");
        let snapshot = streamed(&bytes, "gpt_train");
        let entries = &snapshot.device_traces[0];
        let stacks = snapshot.contexts.stacks().len();
        assert!(stacks > 0 && entries.len() > 10 * stacks, "{} entries share {stacks} stacks", entries.len());
        // Every distinct frame list of the file is one id: as many ids as the general reader,
        // which interns by the identity of the shared list.
        let expected = graph(&bytes).expect("reads");
        assert_eq!(stacks, expected.contexts.stacks().len());
        // A frame dict shared between stacks keeps its strings shared.
        let names: FxHashSet<*const u8> =
            snapshot.contexts.stacks().iter().flat_map(|s| s.iter()).map(|f| f.filename.as_ptr()).collect();
        let texts: FxHashSet<&str> =
            snapshot.contexts.stacks().iter().flat_map(|s| s.iter()).map(|f| &*f.filename).collect();
        assert_eq!(names.len(), texts.len(), "one allocation per file name");
    }

    #[test]
    fn two_entries_on_one_memoised_list_get_one_context() {
        let frame = Frame { filename: "train.py".into(), line: 7, name: "step".into() };
        let mut snapshot = TorchSnapshot::default();
        let stack = snapshot.contexts.intern(&[frame]);
        let entry = |addr| TraceEntry {
            action: TraceAction::Alloc,
            addr,
            size: 512,
            stream: StreamId(0),
            time_us: 0,
            context: Some(stack),
            annotation: None,
        };
        snapshot.device_traces = vec![vec![entry(0), entry(512)]];
        let bytes = write_snapshot(&snapshot).expect("writes");
        assert_eq!(bytes.windows(8).filter(|w| w == b"train.py").count(), 1, "the list is written once");
        let read_back = streamed(&bytes, "two entries");
        let [a, b] = &read_back.device_traces[0][..] else { panic!("two entries") };
        assert_eq!((a.context, b.context), (Some(ContextId(0)), Some(ContextId(0))));
        assert_eq!(read_back.contexts.stacks().len(), 1);
    }

    /// The streaming reader gives up on what it does not know, but never returns a snapshot
    /// that differs from the general reader's: every one-byte change of a small reference
    /// pickle that the guard passes either streams to the general reader's snapshot or is
    /// handed to it.
    #[test]
    fn one_byte_changes_stream_to_the_general_readers_result_or_fall_back() {
        let original = std::fs::read(Path::new(TRACES).join("seeds.pickle")).expect("reads");
        let (mut streamed_count, mut handed_over) = (0, 0);
        // Every fifth byte keeps the debug-build test near ten seconds.
        for at in (0..original.len()).step_by(5) {
            for delta in [1u8, 0xff] {
                let mut bytes = original.clone();
                bytes[at] = bytes[at].wrapping_add(delta);
                let Ok(end) = Guard::new(&bytes).scan() else { continue };
                match read(&bytes[..end], bytes.len()) {
                    Ok(snapshot) => {
                        streamed_count += 1;
                        let expected = graph(&bytes).unwrap_or_else(|e| {
                            panic!("byte {at} + {delta}: streamed, but the general reader says {e}")
                        });
                        assert_same(&snapshot, &expected, &format!("byte {at} + {delta}"));
                    }
                    Err(Unusual) => handed_over += 1,
                }
            }
        }
        assert!(streamed_count > 500 && handed_over > 50, "{streamed_count} streamed, {handed_over} handed over");
    }

    /// Files from 4 MiB on are read with the guard on a second thread.
    #[test]
    fn a_large_pickle_reads_the_same_with_the_guard_beside_the_reader() {
        let bytes = std::fs::read(Path::new(TRACES).join("random_stress_maxsplit.pickle")).expect("reads");
        let mut snapshot = graph(&bytes).expect("reads");
        let trace = snapshot.device_traces[0].clone();
        for _ in 0..3 {
            snapshot.device_traces[0].extend_from_slice(&trace);
        }
        let large = write_snapshot(&snapshot).expect("writes");
        assert!(large.len() >= 4 << 20, "{} bytes", large.len());
        let read = read_snapshot(&large).expect("reads");
        assert_same(&read, &graph(&large).expect("reads"), "four times random_stress_maxsplit");
        assert_eq!(read.device_traces[0].len(), 4 * trace.len());
        // The guard's verdict wins over what the streaming reader made of the same bytes.
        let mut corrupt = large[..large.len() - 1].to_vec();
        corrupt.extend_from_slice(b"cos\nsystem\n.");
        match read_snapshot(&corrupt) {
            Err(e @ PickleError::Malformed { .. }) => {
                assert!(e.to_string().starts_with(&format!("byte {}: GLOBAL", large.len() - 1)), "{e}")
            }
            other => panic!("{:?}", other.map(|_| "a snapshot")),
        }
    }

    #[test]
    fn errors_of_truncated_and_corrupt_pickles_name_their_byte() {
        let bytes = std::fs::read(Path::new(TRACES).join("multistream.pickle")).expect("reads");
        for cut in [3, 1000, bytes.len() / 3, bytes.len() - 2] {
            match read_snapshot(&bytes[..cut]) {
                Err(PickleError::Malformed { offset, message }) => {
                    assert!(offset <= cut && message.contains("truncated"), "cut at {cut}: byte {offset}: {message}")
                }
                other => panic!("cut at {cut}: {:?}", other.map(|_| "a snapshot")),
            }
        }
        // A GLOBAL just before the STOP: refused by the guard at its byte.
        let mut corrupt = bytes[..bytes.len() - 1].to_vec();
        corrupt.extend_from_slice(b"cos\nsystem\n.");
        match read_snapshot(&corrupt) {
            Err(e @ PickleError::Malformed { .. }) => {
                assert!(e.to_string().starts_with(&format!("byte {}: GLOBAL", bytes.len() - 1)), "{e}")
            }
            other => panic!("{:?}", other.map(|_| "a snapshot")),
        }
    }
}
