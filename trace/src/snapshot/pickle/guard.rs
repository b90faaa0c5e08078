//! The guard: a dry run of the pickle machine over shapes, not values

use super::*;

/// The longest decimal integer Python's `int()` parses (`sys.int_info.str_digits_check_threshold`
/// default), which also keeps big-integer parsing linear.
const MAX_TEXT_INT_DIGITS: usize = 4300;

/// How much container work (appends, dict merges, tuple copies) each byte of input may cause.
/// Honest pickles need well under 1; the limit stops inputs whose cost grows faster than their
/// size in a reader that copies shared tuples deeply or merges dicts item by item.
const WORK_PER_BYTE: usize = 16;

/// A value on the dry-run stack: a scalar or one of the [`Shape`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Scalar,
    /// An index into the shapes (`u32` keeps the stack and the memo at 8 bytes a value).
    Container(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ContainerKind {
    List,
    Dict,
    Tuple,
}

impl ContainerKind {
    fn article(self) -> &'static str {
        match self {
            ContainerKind::List => "a list",
            ContainerKind::Dict => "a dict",
            ContainerKind::Tuple => "a tuple",
        }
    }
}

/// What the dry run knows of one container.
#[derive(Clone, Copy, Debug)]
struct Shape {
    kind: ContainerKind,
    /// Levels of containers in it, itself included.
    height: u32,
    /// For tuples, the number of nodes a deep copy makes; else 1.
    weight: usize,
    /// Usable as a dict key (no list or dict in it).
    hashable: bool,
    /// Items (dict: pairs) put in it so far.
    len: usize,
    /// Already inside another container: changing it now could only make a cycle or hide
    /// nesting, and Python's pickler never does it for acyclic data.
    placed: bool,
}

/// Scans a pickle once, checking it the way Python's unpickler would run it, but keeping only
/// the shape of each container. Returns where the pickle ends (just after `STOP`).
pub(super) struct Guard<'b> {
    bytes: &'b [u8],
    pos: usize,
    /// Offset and opcode being read, for errors.
    at: usize,
    op: u8,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    memo: Vec<Option<Slot>>,
    memo_filled: usize,
    shapes: Vec<Shape>,
    /// The items of the container being closed, moved off the stack; kept between containers
    /// so that closing one allocates nothing.
    scratch: Vec<Slot>,
    work: usize,
    work_limit: usize,
}

impl<'b> Guard<'b> {
    pub(super) fn new(bytes: &'b [u8]) -> Self {
        Guard {
            bytes,
            pos: 0,
            at: 0,
            op: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            memo_filled: 0,
            shapes: Vec::new(),
            scratch: Vec::new(),
            work: 0,
            work_limit: bytes.len().saturating_mul(WORK_PER_BYTE).saturating_add(1 << 16),
        }
    }

    fn fail<T>(&self, message: impl std::fmt::Display) -> Result<T, PickleError> {
        Err(PickleError::Malformed { offset: self.at, message: format!("{}: {message}", op::name(self.op)) })
    }

    fn take(&mut self, n: u64) -> Result<&'b [u8], PickleError> {
        let available = self.bytes.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let slice = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(slice)
            }
            _ => self
                .fail(format!("the file ends inside its {n}-byte argument ({available} bytes left; truncated file?)")),
        }
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let slice = self.take(N as u64)?;
        let mut array = [0; N];
        array.copy_from_slice(slice);
        Ok(array)
    }

    fn line(&mut self) -> Result<&'b [u8], PickleError> {
        let rest = &self.bytes[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => self.fail("the file ends inside its text argument (truncated file?)"),
        }
    }

    fn decimal(&mut self) -> Result<u64, PickleError> {
        let line = self.line()?;
        // Python parses the line with `int()`, which allows surrounding whitespace (`\r\n` ends).
        match std::str::from_utf8(line).ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(id) => Ok(id),
            None => self.fail(format!("{:?} is not a memo id", String::from_utf8_lossy(line))),
        }
    }

    fn length_prefixed(&mut self, n: u64, utf8: bool) -> Result<(), PickleError> {
        let data = self.take(n)?;
        if utf8 && std::str::from_utf8(data).is_err() {
            return self.fail("the string is not valid UTF-8");
        }
        Ok(())
    }

    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn top(&self) -> Result<Slot, PickleError> {
        match self.stack.last() {
            Some(&slot) if self.stack.len() > self.base() => Ok(slot),
            _ => self.fail("the stack is empty (corrupt file?)"),
        }
    }

    fn pop(&mut self) -> Result<Slot, PickleError> {
        let slot = self.top()?;
        self.stack.pop();
        Ok(slot)
    }

    fn pop_n(&mut self, n: usize) -> Result<Vec<Slot>, PickleError> {
        if self.stack.len() < self.base() + n {
            return self.fail(format!("needs {n} values on the stack (corrupt file?)"));
        }
        Ok(self.pop_from(self.stack.len() - n))
    }

    fn pop_mark(&mut self) -> Result<Vec<Slot>, PickleError> {
        let mark = self.take_mark()?;
        Ok(self.pop_from(mark))
    }

    /// Closes the innermost MARK, dropping what is above it.
    fn discard_mark(&mut self) -> Result<(), PickleError> {
        let mark = self.take_mark()?;
        self.stack.truncate(mark);
        Ok(())
    }

    fn take_mark(&mut self) -> Result<usize, PickleError> {
        match self.marks.pop() {
            Some(mark) => Ok(mark),
            None => self.fail("there is no MARK to close (corrupt file?)"),
        }
    }

    /// Moves the stack from `start` up into the scratch buffer; give it back with [`Self::recycle`].
    fn pop_from(&mut self, start: usize) -> Vec<Slot> {
        let mut items = std::mem::take(&mut self.scratch);
        items.clear();
        items.extend(self.stack.drain(start..));
        items
    }

    fn recycle(&mut self, items: Vec<Slot>) {
        self.scratch = items;
    }

    /// Builds a container of `kind` from `items` (popped with `pop_n` or `pop_mark`).
    fn close(&mut self, kind: ContainerKind, items: Vec<Slot>) -> Result<(), PickleError> {
        self.new_container(kind, &items)?;
        self.recycle(items);
        Ok(())
    }

    /// Puts `items` (popped with `pop_n` or `pop_mark`) into the container of `kind` below them.
    fn fill_from(&mut self, kind: ContainerKind, items: Vec<Slot>) -> Result<(), PickleError> {
        self.fill(kind, &items)?;
        self.recycle(items);
        Ok(())
    }

    fn add_work(&mut self, n: usize) -> Result<(), PickleError> {
        self.work = self.work.saturating_add(n);
        if self.work > self.work_limit {
            return self.fail("the pickle asks for far more work than its size explains (hostile file?)");
        }
        Ok(())
    }

    fn shape(&self, slot: Slot) -> Option<&Shape> {
        match slot {
            Slot::Scalar => None,
            Slot::Container(i) => self.shapes.get(i as usize),
        }
    }

    fn height(&self, slot: Slot) -> u32 {
        self.shape(slot).map_or(0, |s| s.height)
    }

    fn weight(&self, slot: Slot) -> usize {
        self.shape(slot).map_or(1, |s| s.weight)
    }

    fn hashable(&self, slot: Slot) -> bool {
        self.shape(slot).is_none_or(|s| s.hashable)
    }

    fn place_items(&mut self, items: &[Slot]) {
        for &item in items {
            if let Slot::Container(i) = item
                && let Some(shape) = self.shapes.get_mut(i as usize)
            {
                shape.placed = true;
            }
        }
    }

    fn check_keys(&mut self, items: &[Slot]) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return self.fail(format!("odd number of items ({}) for a dict (corrupt file?)", items.len()));
        }
        for key in items.iter().step_by(2) {
            if !self.hashable(*key) {
                return self.fail("a dict key is a list or a dict (unhashable; corrupt file?)");
            }
            if let Some(shape) = self.shape(*key)
                && shape.kind == ContainerKind::Tuple
            {
                let weight = shape.weight;
                self.add_work(weight)?;
            }
        }
        Ok(())
    }

    fn new_container(&mut self, kind: ContainerKind, items: &[Slot]) -> Result<(), PickleError> {
        let height = 1 + items.iter().map(|&s| self.height(s)).max().unwrap_or(0);
        if height > MAX_NESTING {
            return self.fail(format!("values are nested deeper than {MAX_NESTING} levels"));
        }
        let (weight, hashable, len) = match kind {
            ContainerKind::Tuple => {
                let weight = items.iter().fold(1usize, |w, &s| w.saturating_add(self.weight(s)));
                (weight, items.iter().all(|&s| self.hashable(s)), items.len())
            }
            ContainerKind::List => (1, false, items.len()),
            ContainerKind::Dict => {
                self.check_keys(items)?;
                (1, false, items.len() / 2)
            }
        };
        self.add_work(weight.max(items.len()))?;
        self.place_items(items);
        let Ok(index) = u32::try_from(self.shapes.len()) else {
            return self.fail("more than 4,294,967,295 containers (not a snapshot)");
        };
        self.shapes.push(Shape { kind, height, weight, hashable, len, placed: false });
        self.stack.push(Slot::Container(index));
        Ok(())
    }

    /// APPEND(S) and SETITEM(S): `items` go into the container now on top of the stack.
    fn fill(&mut self, kind: ContainerKind, items: &[Slot]) -> Result<(), PickleError> {
        let target = self.top()?;
        let Some(shape) = self.shape(target).copied() else {
            return self.fail(format!("needs {} below its items, found a scalar (corrupt file?)", kind.article()));
        };
        if shape.kind != kind {
            return self.fail(format!(
                "needs {} below its items, found {} (corrupt file?)",
                kind.article(),
                shape.kind.article()
            ));
        }
        if shape.placed {
            return self.fail(format!(
                "changes {} that is already inside another container (recursive data is not a snapshot)",
                kind.article()
            ));
        }
        if items.contains(&target) {
            return self.fail(format!("puts {} inside itself (recursive data is not a snapshot)", kind.article()));
        }
        let (added, merge_cost) = if kind == ContainerKind::Dict {
            self.check_keys(items)?;
            (items.len() / 2, shape.len)
        } else {
            (items.len(), 0)
        };
        self.add_work(items.len().saturating_add(merge_cost))?;
        let height = shape.height.max(1 + items.iter().map(|&s| self.height(s)).max().unwrap_or(0));
        if height > MAX_NESTING {
            return self.fail(format!("values are nested deeper than {MAX_NESTING} levels"));
        }
        self.place_items(items);
        if let Slot::Container(i) = target
            && let Some(shape) = self.shapes.get_mut(i as usize)
        {
            shape.height = height;
            shape.len = shape.len.saturating_add(added);
        }
        Ok(())
    }

    fn memo_put(&mut self, id: u64) -> Result<(), PickleError> {
        let slot = self.top()?;
        // Python's picklers number memo entries from 0, so an id beyond the file's size is
        // corruption; a memo table (`stream`'s too) would hold a slot for every id up to it.
        let index = match usize::try_from(id) {
            Ok(index) if index < self.bytes.len() => index,
            _ => return self.fail(format!("memo id {id} is beyond anything this file can hold (corrupt file?)")),
        };
        if index >= self.memo.len() {
            self.memo.resize(index + 1, None);
        }
        if self.memo[index].is_none() {
            self.memo_filled += 1;
        }
        self.memo[index] = Some(slot);
        Ok(())
    }

    fn memo_get(&mut self, id: u64) -> Result<(), PickleError> {
        match usize::try_from(id).ok().and_then(|i| self.memo.get(i).copied().flatten()) {
            Some(slot) => {
                self.stack.push(slot);
                Ok(())
            }
            None => self.fail(format!("memo id {id} was never stored (corrupt file?)")),
        }
    }

    pub(super) fn scan(mut self) -> Result<usize, PickleError> {
        loop {
            self.at = self.pos;
            let Some(&code) = self.bytes.get(self.pos) else {
                return Err(PickleError::Malformed {
                    offset: self.pos,
                    message: "the file ends before the pickle's STOP opcode (truncated file?)".into(),
                });
            };
            self.op = code;
            self.pos += 1;
            match code {
                op::PROTO => {
                    let [version] = self.take_array()?;
                    if version > 5 {
                        return self.fail(format!("protocol {version} is newer than any Python writes"));
                    }
                }
                op::FRAME => {
                    self.take(8)?;
                }
                op::STOP => {
                    self.pop()?;
                    return Ok(self.pos);
                }
                op::MARK => {
                    if self.marks.len() >= MAX_NESTING as usize {
                        return self.fail(format!("MARKs are nested deeper than {MAX_NESTING} levels"));
                    }
                    self.marks.push(self.stack.len());
                }
                op::POP => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else {
                        self.discard_mark()?;
                    }
                }
                op::POP_MARK => {
                    self.discard_mark()?;
                }
                op::DUP => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                op::PUT => {
                    let id = self.decimal()?;
                    self.memo_put(id)?;
                }
                op::BINPUT => {
                    let [id] = self.take_array()?;
                    self.memo_put(id.into())?;
                }
                op::LONG_BINPUT => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_put(id.into())?;
                }
                op::MEMOIZE => {
                    // Python numbers a MEMOIZE by the count of entries, `stream` by the highest
                    // id + 1: they only agree when explicit ids left no gaps.
                    if self.memo_filled != self.memo.len() {
                        return self.fail("follows explicit memo ids that left gaps (corrupt file?)");
                    }
                    self.memo_put(self.memo.len() as u64)?;
                }
                op::GET => {
                    let id = self.decimal()?;
                    self.memo_get(id)?;
                }
                op::BINGET => {
                    let [id] = self.take_array()?;
                    self.memo_get(id.into())?;
                }
                op::LONG_BINGET => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_get(id.into())?;
                }
                op::NONE | op::NEWTRUE | op::NEWFALSE => self.stack.push(Slot::Scalar),
                op::INT | op::LONG => {
                    if self.line()?.len() > MAX_TEXT_INT_DIGITS + 2 {
                        return self.fail(format!("integer literal longer than {MAX_TEXT_INT_DIGITS} digits"));
                    }
                    self.stack.push(Slot::Scalar);
                }
                op::FLOAT | op::STRING | op::UNICODE => {
                    self.line()?;
                    self.stack.push(Slot::Scalar);
                }
                op::BININT1 => {
                    self.take(1)?;
                    self.stack.push(Slot::Scalar);
                }
                op::BININT2 => {
                    self.take(2)?;
                    self.stack.push(Slot::Scalar);
                }
                op::BININT => {
                    self.take(4)?;
                    self.stack.push(Slot::Scalar);
                }
                op::BINFLOAT => {
                    self.take(8)?;
                    self.stack.push(Slot::Scalar);
                }
                op::LONG1 | op::SHORT_BINSTRING | op::SHORT_BINBYTES | op::SHORT_BINUNICODE => {
                    let [n] = self.take_array()?;
                    self.length_prefixed(n.into(), code == op::SHORT_BINUNICODE)?;
                    self.stack.push(Slot::Scalar);
                }
                op::LONG4 | op::BINSTRING => {
                    let n = i32::from_le_bytes(self.take_array()?);
                    let Ok(n) = u64::try_from(n) else {
                        return self.fail(format!("negative length {n} (corrupt file?)"));
                    };
                    self.length_prefixed(n, false)?;
                    self.stack.push(Slot::Scalar);
                }
                op::BINUNICODE | op::BINBYTES => {
                    let n = u32::from_le_bytes(self.take_array()?);
                    self.length_prefixed(n.into(), code == op::BINUNICODE)?;
                    self.stack.push(Slot::Scalar);
                }
                op::BINUNICODE8 | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = u64::from_le_bytes(self.take_array()?);
                    self.length_prefixed(n, code == op::BINUNICODE8)?;
                    self.stack.push(Slot::Scalar);
                }
                op::EMPTY_TUPLE => self.new_container(ContainerKind::Tuple, &[])?,
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let items = self.pop_n(usize::from(code - op::TUPLE1) + 1)?;
                    self.close(ContainerKind::Tuple, items)?;
                }
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.close(ContainerKind::Tuple, items)?;
                }
                op::EMPTY_LIST => self.new_container(ContainerKind::List, &[])?,
                op::LIST => {
                    let items = self.pop_mark()?;
                    self.close(ContainerKind::List, items)?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    self.fill(ContainerKind::List, &[item])?;
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    self.fill_from(ContainerKind::List, items)?;
                }
                op::EMPTY_DICT => self.new_container(ContainerKind::Dict, &[])?,
                op::DICT => {
                    let items = self.pop_mark()?;
                    self.close(ContainerKind::Dict, items)?;
                }
                op::SETITEM => {
                    let items = self.pop_n(2)?;
                    self.fill_from(ContainerKind::Dict, items)?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    self.fill_from(ContainerKind::Dict, items)?;
                }
                op::EMPTY_SET | op::ADDITEMS | op::FROZENSET => {
                    return self.fail("sets never occur in a PyTorch snapshot");
                }
                op::GLOBAL
                | op::STACK_GLOBAL
                | op::REDUCE
                | op::BUILD
                | op::INST
                | op::OBJ
                | op::NEWOBJ
                | op::NEWOBJ_EX
                | op::PERSID
                | op::BINPERSID
                | op::EXT1
                | op::EXT2
                | op::EXT4
                | op::NEXT_BUFFER
                | op::READONLY_BUFFER => {
                    return self.fail(
                        "objects, classes and external references never occur in a PyTorch snapshot; not reading it",
                    );
                }
                _ => {
                    return Err(PickleError::Malformed {
                        offset: self.at,
                        message: format!("unknown opcode 0x{code:02x} (corrupt file, or not a pickle?)"),
                    });
                }
            }
        }
    }
}
