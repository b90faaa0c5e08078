//! The reader's pickle machine: opcodes → typed containers, without a value graph
//!
//! Runs the pickle machine, but its values are the snapshot's own: scalars stay on the stack
//! (strings as places in the input), and each container is typed the moment it is created by
//! the role its parent gives it there (a trace entry, a stack, a segment...). Python's pickler
//! (and PyTorch's C++ one) create every container before its items and fill it at once
//! (`EMPTY_LIST`, then `MARK` items `APPENDS`, or one item and `APPEND`), so the role can be read
//! off the stack: the container that owns the innermost `MARK`, or the one just below. With the
//! role comes the container's place in the snapshot ([`At`]), for errors. An item is converted
//! when it is put into its typed list (`convert.rs`): an entry dict becomes a [`TraceEntry`]
//! when it is appended to its trace and its fields are freed then, so memory follows the
//! snapshot, not the pickle's value graph.
//!
//! Every role is checked again where the container is actually placed, and what does not fit
//! is an error naming that place: a value of the wrong type, a container shared between two
//! places of the snapshot (PyTorch writes each entry, block and segment once; frame lists and
//! frame dicts, which it does share, are read once and shared here too), or one built before
//! its place could be known (not a layout any of those picklers write). Protocols 0 and 1
//! (Python's text formats, which PyTorch never writes) are refused with a clear error.
//!
//! Its result is used only when the [`super::Guard`] passes the pickle (then no container was
//! changed after it was placed, so each is complete when it is converted), but it runs on any
//! input without the guard's help, so the two can run at once: it never recurses or panics,
//! builds no graph, and its work and memory grow linearly with the input (every item is
//! converted where it is placed, each list, segment or entry at most once, and each frame
//! list interned once however often it is shared).

use super::*;
use place::At;

/// A step of the reader: its value, or the error it names. Boxed, because errors are rare and
/// a small `Result` keeps the moves of the hot path cheap.
pub(super) type Flow<T> = Result<T, Box<PickleError>>;

/// A value on the machine's stack or in its memo: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX` that fits in 64 bits unsigned.
    Big(u64),
    /// An integer beyond 64 bits: nothing a snapshot field holds.
    Long,
    Bytes,
    Float(f64),
    /// A string: its place in the input.
    Str {
        start: usize,
        len: u32,
    },
    /// A container: index into [`Stream::nodes`].
    Node(u32),
}

const _: () = assert!(std::mem::size_of::<Val>() <= 16);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    List,
    Dict,
    Tuple,
}

impl Kind {
    pub(super) fn article(self) -> &'static str {
        match self {
            Kind::List => "a list",
            Kind::Dict => "a dict",
            Kind::Tuple => "a tuple",
        }
    }
}

/// What a container is in the snapshot, read from where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
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
pub(super) const MAX_FIELDS: usize = ROUNDUP_INTERVALS;

impl Role {
    /// The kind of container the role must be.
    pub(super) fn accepts(self, kind: Kind) -> bool {
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

    /// What a value of this role is, for errors (`expected ...`).
    pub(super) fn expected(self) -> &'static str {
        match self {
            Role::Stack => "a list of frames",
            Role::PoolId => "a tuple of two integers",
            _ if self.accepts(Kind::Dict) => "a dict",
            _ => "a list",
        }
    }

    /// What a container of this role is, for errors.
    pub(super) fn describe(self) -> &'static str {
        match self {
            Role::Root => "the snapshot",
            Role::Segments => "the list of segments",
            Role::Segment => "a segment",
            Role::Blocks => "a segment's blocks",
            Role::Block => "a block",
            Role::Stack => "a list of frames",
            Role::Frame => "a frame",
            Role::DeviceTraces => "device_traces",
            Role::Trace => "a device's trace",
            Role::Entry => "a trace entry",
            Role::Settings => "allocator_settings",
            Role::Divisions => "roundup_power2_divisions",
            Role::Annotations => "external_annotations",
            Role::Annotation => "an annotation",
            Role::PoolId => "a segment_pool_id",
            Role::Ignored => "a value the snapshot does not read",
        }
    }

    /// The keys a dict role reads, in field order.
    pub(super) fn fields(self) -> &'static [&'static str] {
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
pub(super) struct PendingBlock {
    pub(super) address: Option<u64>,
    pub(super) size: u64,
    pub(super) requested_size: u64,
    pub(super) state: BlockState,
    pub(super) frames: Option<ContextId>,
}

/// A typed list's items so far, and where the list sits.
pub(super) struct List<T> {
    pub(super) at: At,
    pub(super) items: Vec<T>,
}

impl<T> List<T> {
    fn new(at: At) -> Self {
        List { at, items: Vec::new() }
    }
}

/// A typed dict's fields so far, by index into [`Role::fields`], and where the dict sits.
pub(super) struct Fields {
    pub(super) at: At,
    pub(super) values: [Option<Val>; MAX_FIELDS],
}

/// What a container holds so far. Everything but an interned id is boxed, so that a node
/// (one per container of the file) stays at 24 bytes.
pub(super) enum Data {
    /// Ignored, not begun, or already moved into its parent.
    Nothing,
    Fields(Box<Fields>),
    Segments(Box<List<TorchSegment>>),
    Blocks(Box<List<PendingBlock>>),
    /// A frame list until it is first used, then its interned id (shared lists stay shared).
    Frames(Box<List<Frame>>),
    Interned(ContextId),
    /// A frame dict after its first use (frame dicts are shared between stacks too).
    Frame(Box<Frame>),
    Traces(Box<List<Vec<TraceEntry>>>),
    Trace(Box<List<TraceEntry>>),
    Annotations(Box<List<ExternalAnnotation>>),
    Items(Box<List<Val>>),
}

impl Data {
    /// Where the container sits and how many items it holds (for a list; 0 for a dict).
    fn at_and_len(&self) -> Option<(At, usize)> {
        Some(match self {
            Data::Fields(d) => (d.at, 0),
            Data::Segments(l) => (l.at, l.items.len()),
            Data::Blocks(l) => (l.at, l.items.len()),
            Data::Frames(l) => (l.at, l.items.len()),
            Data::Traces(l) => (l.at, l.items.len()),
            Data::Trace(l) => (l.at, l.items.len()),
            Data::Annotations(l) => (l.at, l.items.len()),
            Data::Items(l) => (l.at, l.items.len()),
            Data::Nothing | Data::Interned(_) | Data::Frame(_) => return None,
        })
    }
}

pub(super) struct Node {
    pub(super) kind: Kind,
    pub(super) role: Role,
    pub(super) data: Data,
}

/// A small cache of which field a key string names, by the key's place in the input: the
/// pickler memoises each key once, so nearly every lookup is the same few places.
#[derive(Clone, Copy)]
struct KeyHit {
    start: usize,
    role: Role,
    field: Option<u8>,
    /// The role of the value under this key.
    child: Role,
}

const KEY_CACHE: usize = 256;

pub(super) struct Stream<'b> {
    pub(super) bytes: &'b [u8],
    pos: usize,
    /// Offset and opcode being run, for errors.
    op_at: usize,
    op: u8,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    pub(super) nodes: Vec<Node>,
    scratch: Vec<Val>,
    /// Field boxes of dicts already converted, reused: one allocation per dict alive at once,
    /// not per dict.
    #[allow(clippy::vec_box, reason = "the boxes move in and out of `Data::Fields`, which they keep small")]
    pub(super) spare: Vec<Box<Fields>>,
    keys: [Option<KeyHit>; KEY_CACHE],
    /// Stacks and annotations in the order this reader meets them (`convert::finish` numbers
    /// them in field order).
    pub(super) contexts: ContextTable,
    pub(super) names: FxHashSet<Arc<str>>,
    /// The file is a bare list of segments (`torch.cuda.memory_snapshot()`), not the dict.
    pub(super) bare: bool,
}

impl<'b> Stream<'b> {
    pub(super) fn new(bytes: &'b [u8]) -> Self {
        Stream {
            bytes,
            pos: 0,
            op_at: 0,
            op: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            nodes: Vec::new(),
            scratch: Vec::new(),
            spare: Vec::new(),
            keys: [None; KEY_CACHE],
            contexts: ContextTable::default(),
            names: FxHashSet::default(),
            bare: false,
        }
    }

    /// Reads the pickle (its end is its STOP) into a snapshot.
    pub(super) fn read(&mut self) -> Result<TorchSnapshot, PickleError> {
        let read = self.protocol().and_then(|()| self.run()).and_then(|root| self.root(root));
        read.map(convert::finish).map_err(|error| *error)
    }

    /// Python writes protocols 0 and 1 without a PROTO opcode, 2 and up with one.
    fn protocol(&self) -> Flow<()> {
        let protocol = match self.bytes {
            [op::PROTO, version, ..] => *version,
            _ => 0,
        };
        if protocol < 2 {
            return Err(Box::new(PickleError::Malformed {
                offset: 0,
                message: format!(
                    "a pickle of protocol {}, one of Python's oldest formats, which PyTorch never writes; \
                     this reader reads protocols 2 to 5 (load the file in Python and write it again with \
                     pickle.dump, whose default protocol is 4 or newer)",
                    if protocol == 0 { "0 or 1".to_owned() } else { protocol.to_string() }
                ),
            }));
        }
        Ok(())
    }

    /// The error of an opcode that the guard refuses too (the guard's error is the one given):
    /// this reader may run before the guard's verdict, on any input.
    #[cold]
    fn corrupt(&self) -> Box<PickleError> {
        Box::new(PickleError::Malformed {
            offset: self.op_at,
            message: format!("{}: the pickle does not hold what this opcode needs (corrupt file?)", op::name(self.op)),
        })
    }

    /// The error `message` at `spot`.
    #[cold]
    pub(super) fn invalid(&self, spot: place::Spot<'_>, message: impl Into<String>) -> Box<PickleError> {
        Box::new(spot.invalid(self.bare, message))
    }

    fn bytes_ahead(&mut self, n: usize) -> Flow<&'b [u8]> {
        let slice = self.pos.checked_add(n).and_then(|end| self.bytes.get(self.pos..end));
        let Some(slice) = slice else { return Err(self.corrupt()) };
        self.pos += n;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Flow<[u8; N]> {
        let slice = self.bytes_ahead(N)?;
        let mut array = [0; N];
        array.copy_from_slice(slice);
        Ok(array)
    }

    fn str_ahead(&mut self, len: usize) -> Flow<Val> {
        let start = self.pos;
        self.bytes_ahead(len)?;
        match u32::try_from(len) {
            Ok(len) => Ok(Val::Str { start, len }),
            Err(_) => Err(Box::new(PickleError::Malformed {
                offset: self.op_at,
                message: format!("{}: a string of {len} bytes, more than a snapshot holds", op::name(self.op)),
            })),
        }
    }

    /// The text of a string value (`None` for any other value). The guard checks the UTF-8;
    /// this reader may run before its verdict, so it checks again rather than trust it.
    pub(super) fn text(&self, val: Val) -> Option<&'b str> {
        match val {
            Val::Str { start, len } => {
                let bytes = self.bytes.get(start..start.checked_add(len as usize)?)?;
                std::str::from_utf8(bytes).ok()
            }
            _ => None,
        }
    }

    /// A little-endian two's-complement integer (`LONG1`, `LONG4`).
    fn long(&mut self, len: usize) -> Flow<Val> {
        let bytes = self.bytes_ahead(len)?;
        if len > 16 {
            return Ok(Val::Long);
        }
        let Some(&last) = bytes.last() else { return Ok(Val::Int(0)) };
        let mut value: i128 = if last & 0x80 != 0 { -1 } else { 0 };
        for &b in bytes.iter().rev() {
            value = (value << 8) | i128::from(b);
        }
        Ok(match (i64::try_from(value), u64::try_from(value)) {
            (Ok(i), _) => Val::Int(i),
            (_, Ok(u)) => Val::Big(u),
            _ => Val::Long,
        })
    }

    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Flow<Val> {
        if self.stack.len() <= self.base() {
            return Err(self.corrupt());
        }
        self.stack.pop().ok_or_else(|| self.corrupt())
    }

    fn top(&self) -> Flow<Val> {
        match self.stack.last() {
            Some(&top) if self.stack.len() > self.base() => Ok(top),
            _ => Err(self.corrupt()),
        }
    }

    /// APPENDS and SETITEMS: closes the innermost MARK and runs `fill` on the container below
    /// it with the items above it, read in place, then drops them.
    fn marked(&mut self, fill: fn(&mut Self, Val, &[Val]) -> Flow<()>) -> Flow<()> {
        let mark = self.marks.pop().ok_or_else(|| self.corrupt())?;
        if mark == 0 || mark - 1 < self.base() || mark > self.stack.len() {
            return Err(self.corrupt());
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
        let mark = self.marks.pop().ok_or_else(|| self.corrupt())?;
        self.pop_from(mark)
    }

    fn pop_from(&mut self, start: usize) -> Flow<Vec<Val>> {
        if start > self.stack.len() {
            return Err(self.corrupt());
        }
        let mut items = std::mem::take(&mut self.scratch);
        items.clear();
        items.extend(self.stack.drain(start..));
        Ok(items)
    }

    pub(super) fn node(&self, val: Val) -> Option<&Node> {
        match val {
            Val::Node(i) => self.nodes.get(i as usize),
            _ => None,
        }
    }

    /// Which field of `role` the key `key` names (`None`: one the snapshot does not read), and
    /// the role of the value under it.
    fn field_and_role(&mut self, role: Role, key: Val) -> (Option<usize>, Role) {
        let Val::Str { start, .. } = key else { return (None, Role::Ignored) };
        let slot = start % KEY_CACHE;
        if let Some(hit) = self.keys[slot]
            && hit.start == start
            && hit.role == role
        {
            return (hit.field.map(usize::from), hit.child);
        }
        let Some(text) = self.text(key) else { return (None, Role::Ignored) };
        let field = role.fields().iter().position(|name| *name == text);
        let child = role.field(field);
        self.keys[slot] = Some(KeyHit { start, role, field: field.map(|f| f as u8), child });
        (field, child)
    }

    /// The role a container created now gets, and its place: as an item of the container just
    /// below it on the stack (one `APPEND`/`SETITEM`), or of the container that owns the
    /// innermost MARK.
    fn infer(&mut self, kind: Kind) -> (Role, At) {
        if self.stack.is_empty() && self.marks.is_empty() {
            return match kind {
                Kind::Dict => (Role::Root, At::Root),
                Kind::List => {
                    self.bare = true;
                    (Role::Segments, At::Segments)
                }
                Kind::Tuple => (Role::Ignored, At::Root),
            };
        }
        let base = self.base();
        let len = self.stack.len();
        let above = len - base;
        let fits = |(role, _): &(Role, At)| *role != Role::Ignored && role.accepts(kind);
        if above >= 1 {
            let top = self.stack[len - 1];
            let below = if let Some(node) = self.node(top)
                && node.kind == Kind::List
            {
                self.item_of(top, 0)
            } else if above >= 2
                && let Val::Str { .. } = top
                && self.node(self.stack[len - 2]).is_some_and(|n| n.kind == Kind::Dict)
            {
                self.field_of(self.stack[len - 2], top)
            } else {
                None
            };
            if let Some(below) = below.filter(fits) {
                return below;
            }
        }
        let owner = match self.marks.is_empty() || base == 0 {
            true => None,
            false => match self.node(self.stack[base - 1]).map(|n| n.kind) {
                Some(Kind::List) => self.item_of(self.stack[base - 1], above),
                Some(Kind::Dict) if above % 2 == 1 => self.field_of(self.stack[base - 1], self.stack[len - 1]),
                _ => None,
            },
        };
        owner.filter(fits).unwrap_or((Role::Ignored, At::Root))
    }

    /// The role and place of a new item of the list `list`, `offset` items past its end.
    fn item_of(&self, list: Val, offset: usize) -> Option<(Role, At)> {
        let node = self.node(list)?;
        let (at, len) = node.data.at_and_len()?;
        Some((node.role.item(), at.item(len + offset)))
    }

    /// The role and place of the value under `key` in the dict `dict`.
    fn field_of(&mut self, dict: Val, key: Val) -> Option<(Role, At)> {
        let node = self.node(dict)?;
        let (role, (at, _)) = (node.role, node.data.at_and_len()?);
        let (_, child) = self.field_and_role(role, key);
        Some((child, at.child(child)))
    }

    fn new_node(&mut self, kind: Kind) -> Flow<u32> {
        let (role, at) = self.infer(kind);
        let data = match role {
            Role::Segments => Data::Segments(Box::new(List::new(at))),
            Role::Blocks => Data::Blocks(Box::new(List::new(at))),
            Role::Stack => Data::Frames(Box::new(List::new(at))),
            Role::DeviceTraces => Data::Traces(Box::new(List::new(at))),
            Role::Trace => Data::Trace(Box::new(List::new(at))),
            Role::Annotations => Data::Annotations(Box::new(List::new(at))),
            Role::PoolId => Data::Items(Box::new(List::new(at))),
            Role::Ignored => Data::Nothing,
            // The dict roles.
            _ => Data::Fields(match self.spare.pop() {
                Some(mut fields) => {
                    fields.at = at;
                    fields
                }
                None => Box::new(Fields { at, values: [None; MAX_FIELDS] }),
            }),
        };
        let Ok(index) = u32::try_from(self.nodes.len()) else { return Err(self.corrupt()) };
        self.nodes.push(Node { kind, role, data });
        Ok(index)
    }

    /// APPEND(S), or the items of LIST or a tuple: `items` go into `target`, converted to the
    /// snapshot's types if it is a typed list.
    fn append(&mut self, target: Val, items: &[Val]) -> Flow<()> {
        let Val::Node(index) = target else { return Err(self.corrupt()) };
        let index = index as usize;
        if self.nodes.get(index).is_none_or(|n| n.kind == Kind::Dict) {
            return Err(self.corrupt());
        }
        // Take the list's data out while its items are converted (they are nodes too).
        let mut data = std::mem::replace(&mut self.nodes[index].data, Data::Nothing);
        let result = self.fill(&mut data, items);
        self.nodes[index].data = data;
        result
    }

    fn fill(&mut self, data: &mut Data, items: &[Val]) -> Flow<()> {
        /// Converts each item at its place in `list` and pushes it.
        fn each<'b, T>(
            stream: &mut Stream<'b>,
            list: &mut List<T>,
            items: &[Val],
            convert: fn(&mut Stream<'b>, Val, At) -> Flow<T>,
        ) -> Flow<()> {
            list.items.reserve(items.len());
            for &item in items {
                let at = list.at.item(list.items.len());
                list.items.push(convert(stream, item, at)?);
            }
            Ok(())
        }
        match data {
            Data::Nothing => Ok(()),
            Data::Segments(list) => each(self, list, items, Self::segment),
            Data::Blocks(list) => each(self, list, items, Self::block),
            Data::Frames(list) => each(self, list, items, Self::frame),
            Data::Traces(list) => each(self, list, items, Self::trace),
            Data::Trace(list) => each(self, list, items, Self::entry),
            Data::Annotations(list) => each(self, list, items, Self::annotation),
            Data::Items(list) => {
                list.items.extend_from_slice(items);
                Ok(())
            }
            // A frame list already used (then changed: the guard refuses that), or a dict.
            Data::Interned(_) | Data::Frame(_) | Data::Fields(_) => Err(self.corrupt()),
        }
    }

    /// SETITEM(S), or the items of DICT: `pairs` (key, value, key, value...) go into `target`.
    fn set_items(&mut self, target: Val, pairs: &[Val]) -> Flow<()> {
        let Val::Node(index) = target else { return Err(self.corrupt()) };
        let index = index as usize;
        let Some(&Node { kind, role, .. }) = self.nodes.get(index) else { return Err(self.corrupt()) };
        if kind != Kind::Dict || !pairs.len().is_multiple_of(2) {
            return Err(self.corrupt());
        }
        if role == Role::Ignored {
            return Ok(());
        }
        for pair in pairs.chunks_exact(2) {
            let (field, _) = self.field_and_role(role, pair[0]);
            let Some(field) = field else {
                if role == Role::Divisions {
                    return Err(self.not_an_interval(pair[0]));
                }
                continue;
            };
            let Data::Fields(fields) = &mut self.nodes[index].data else { return Err(self.corrupt()) };
            // A key set twice keeps its last value, as in Python.
            fields.values[field] = Some(pair[1]);
        }
        Ok(())
    }

    #[cold]
    fn not_an_interval(&self, key: Val) -> Box<PickleError> {
        match self.text(key) {
            Some(key) => {
                self.invalid(At::Divisions.key(key), "not an interval key (\"1\", \"2\", \"4\", ... \"32768\")")
            }
            None => self.invalid(At::Divisions.here(), "has a key that is not a string"),
        }
    }

    fn memo_put(&mut self, id: usize) -> Flow<()> {
        let top = self.top()?;
        if id >= self.bytes.len() {
            return Err(self.corrupt());
        }
        if id >= self.memo.len() {
            self.memo.resize(id + 1, None);
        }
        self.memo[id] = Some(top);
        Ok(())
    }

    fn memo_get(&mut self, id: usize) -> Flow<()> {
        let val = self.memo.get(id).copied().flatten().ok_or_else(|| self.corrupt())?;
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
            self.op_at = self.pos;
            let [code] = self.take_array()?;
            self.op = code;
            match code {
                op::PROTO => {
                    self.bytes_ahead(1)?;
                }
                op::FRAME => {
                    self.bytes_ahead(8)?;
                }
                op::STOP => return self.pop(),
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else {
                        let mark = self.marks.pop().ok_or_else(|| self.corrupt())?;
                        self.stack.truncate(mark);
                    }
                }
                op::POP_MARK => {
                    let mark = self.marks.pop().ok_or_else(|| self.corrupt())?;
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
                    let n = i32::from_le_bytes(self.take_array()?);
                    let n = usize::try_from(n).map_err(|_| self.corrupt())?;
                    let val = self.long(n)?;
                    self.stack.push(val);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.stack.push(Val::Float(v));
                }
                op::SHORT_BINUNICODE => {
                    let [n] = self.take_array()?;
                    let val = self.str_ahead(n.into())?;
                    self.stack.push(val);
                }
                op::BINUNICODE => {
                    let n = u32::from_le_bytes(self.take_array()?);
                    let val = self.str_ahead(n as usize)?;
                    self.stack.push(val);
                }
                op::BINUNICODE8 => {
                    let n = usize::try_from(u64::from_le_bytes(self.take_array()?)).map_err(|_| self.corrupt())?;
                    let val = self.str_ahead(n)?;
                    self.stack.push(val);
                }
                op::SHORT_BINBYTES => {
                    let [n] = self.take_array()?;
                    self.bytes_ahead(n.into())?;
                    self.stack.push(Val::Bytes);
                }
                op::BINBYTES => {
                    let n = u32::from_le_bytes(self.take_array()?);
                    self.bytes_ahead(n as usize)?;
                    self.stack.push(Val::Bytes);
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = usize::try_from(u64::from_le_bytes(self.take_array()?)).map_err(|_| self.corrupt())?;
                    self.bytes_ahead(n)?;
                    self.stack.push(Val::Bytes);
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
                                return Err(self.corrupt());
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
                op::INT
                | op::LONG
                | op::FLOAT
                | op::STRING
                | op::UNICODE
                | op::BINSTRING
                | op::SHORT_BINSTRING
                | op::PUT
                | op::GET => {
                    return Err(Box::new(PickleError::Malformed {
                        offset: self.op_at,
                        message: format!(
                            "{}: an opcode of Python's protocols 0 and 1, which its pickler never writes \
                             in a pickle of protocol 2 or newer",
                            op::name(code)
                        ),
                    }));
                }
                // Sets, objects and unknown opcodes: the guard names them.
                _ => return Err(self.corrupt()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/traces/pytorch-2.11-h200");

    fn reference(name: &str) -> Vec<u8> {
        std::fs::read(Path::new(TRACES).join(format!("{name}.pickle"))).expect("the reference traces")
    }

    fn invalid(bytes: &[u8]) -> String {
        match read_snapshot(bytes) {
            Err(e @ PickleError::Invalid { .. }) => e.to_string(),
            other => panic!("expected an error naming a place, got {:?}", other.map(|_| "a snapshot")),
        }
    }

    #[test]
    fn a_memoised_frame_list_is_interned_once_and_its_frames_shared() {
        let snapshot = read_snapshot(&reference("gpt_train")).expect("reads");
        let entries = &snapshot.device_traces[0];
        let stacks = snapshot.contexts.stacks().len();
        assert!(stacks > 0 && entries.len() > 10 * stacks, "{} entries share {stacks} stacks", entries.len());
        // A frame dict shared between stacks keeps its strings shared.
        let names: FxHashSet<*const u8> =
            snapshot.contexts.stacks().iter().flat_map(|s| s.iter()).map(|f| f.filename.as_ptr()).collect();
        let texts: FxHashSet<&str> =
            snapshot.contexts.stacks().iter().flat_map(|s| s.iter()).map(|f| &*f.filename).collect();
        assert_eq!(names.len(), texts.len(), "one allocation per file name");
    }

    fn one_stack_twice() -> (TorchSnapshot, Vec<u8>) {
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
        (snapshot, bytes)
    }

    #[test]
    fn two_entries_on_one_memoised_list_get_one_context() {
        let (_, bytes) = one_stack_twice();
        assert_eq!(bytes.windows(8).filter(|w| w == b"train.py").count(), 1, "the list is written once");
        let read_back = read_snapshot(&bytes).expect("reads");
        let [a, b] = &read_back.device_traces[0][..] else { panic!("two entries") };
        assert_eq!((a.context, b.context), (Some(ContextId(0)), Some(ContextId(0))));
        assert_eq!(read_back.contexts.stacks().len(), 1);
    }

    /// `{"segments": [], "device_traces": [trace, ...]}` with `traces` (opcodes) as the list's items.
    fn with_traces(traces: &[u8]) -> Vec<u8> {
        let mut bytes = vec![op::PROTO, 4, op::EMPTY_DICT, op::MARK];
        for (key, value) in [("segments", &[op::EMPTY_LIST][..]), ("device_traces", &[op::EMPTY_LIST, op::MARK])] {
            bytes.extend([op::SHORT_BINUNICODE, key.len() as u8]);
            bytes.extend(key.as_bytes());
            bytes.extend(value);
        }
        bytes.extend(traces);
        bytes.extend([op::APPENDS, op::SETITEMS, op::STOP]);
        bytes
    }

    /// `{"action": "alloc", "addr": 0, "size": 512}`
    fn entry_dict() -> Vec<u8> {
        let mut bytes = vec![op::EMPTY_DICT, op::MARK];
        let alloc = [op::SHORT_BINUNICODE, 5, b'a', b'l', b'l', b'o', b'c'];
        for (key, value) in [("action", &alloc[..]), ("addr", &[op::BININT1, 0]), ("size", &[op::BININT2, 0, 2])] {
            bytes.extend([op::SHORT_BINUNICODE, key.len() as u8]);
            bytes.extend(key.as_bytes());
            bytes.extend(value);
        }
        bytes.push(op::SETITEMS);
        bytes
    }

    /// A trace or an entry referenced twice through the memo would be read twice; PyTorch never
    /// writes that, and the error names the second place.
    #[test]
    fn a_trace_or_entry_shared_through_the_memo_is_refused_at_its_second_place() {
        let mut trace = vec![op::EMPTY_LIST, op::MEMOIZE];
        trace.extend(entry_dict());
        trace.extend([op::APPEND, op::BINGET, 0]);
        let text = invalid(&with_traces(&trace));
        assert!(text.starts_with("device_traces[1]: a list that already stands at an earlier place"), "{text}");

        let mut trace = vec![op::EMPTY_LIST, op::MARK];
        trace.extend(entry_dict());
        trace.extend([op::MEMOIZE, op::BINGET, 0, op::APPENDS]);
        let text = invalid(&with_traces(&trace));
        assert!(text.starts_with("device_traces[0][1]: a dict that already stands at an earlier place"), "{text}");

        // The same entry twice, each written out: read.
        let mut trace = vec![op::EMPTY_LIST, op::MARK];
        trace.extend(entry_dict());
        trace.extend(entry_dict());
        trace.push(op::APPENDS);
        let snapshot = read_snapshot(&with_traces(&trace)).expect("reads");
        assert_eq!(snapshot.device_traces[0].len(), 2);
    }

    #[test]
    fn old_protocols_and_their_opcodes_are_refused_clearly() {
        let protocol0 = b"(lp0\n.";
        let e = read_snapshot(protocol0).expect_err("protocol 0");
        assert!(e.to_string().starts_with("byte 0: a pickle of protocol 0 or 1"), "{e}");
        let e = read_snapshot(&[op::PROTO, 1, op::EMPTY_LIST, op::STOP]).expect_err("protocol 1");
        assert!(e.to_string().starts_with("byte 0: a pickle of protocol 1"), "{e}");
        let e = read_snapshot(b"\x80\x04]I12\na.").expect_err("a text INT in protocol 4");
        assert!(e.to_string().starts_with("byte 3: INT: an opcode of Python's protocols 0 and 1"), "{e}");
    }

    #[test]
    fn errors_of_truncated_and_corrupt_pickles_name_their_byte() {
        let bytes = reference("multistream");
        for cut in [3, 1000, bytes.len() / 3, bytes.len() - 2] {
            match read_snapshot(&bytes[..cut]) {
                Err(PickleError::Malformed { offset, message }) => {
                    assert!(offset <= cut && message.contains("truncated"), "cut at {cut}: byte {offset}: {message}")
                }
                other => panic!("cut at {cut}: {:?}", other.map(|_| "a snapshot")),
            }
        }
    }

    #[test]
    fn a_value_is_16_bytes_and_a_node_24() {
        assert!(std::mem::size_of::<Val>() <= 16);
        assert!(std::mem::size_of::<Node>() <= 24, "{}", std::mem::size_of::<Node>());
    }
}
