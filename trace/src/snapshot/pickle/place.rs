//! Places: where in the snapshot a value sits, rendered only for errors

use super::*;

#[derive(Clone, Copy)]
enum Step<'a> {
    Root,
    Field(&'a str),
    Key(&'a str),
    Index(usize),
}

/// A path from the root of the snapshot to a value, kept on the call stack.
#[derive(Clone, Copy)]
pub(super) struct Place<'a> {
    parent: Option<&'a Place<'a>>,
    step: Step<'a>,
}

impl<'a> Place<'a> {
    pub(super) const ROOT: Place<'static> = Place { parent: None, step: Step::Root };

    /// A field of a dict whose keys are fixed names (`.size`).
    #[inline]
    pub(super) fn field(&'a self, name: &'a str) -> Place<'a> {
        Place { parent: Some(self), step: Step::Field(name) }
    }

    /// An entry of a dict keyed by data (`["1"]`).
    #[inline]
    pub(super) fn key(&'a self, key: &'a str) -> Place<'a> {
        Place { parent: Some(self), step: Step::Key(key) }
    }

    pub(super) fn index(&'a self, index: usize) -> Place<'a> {
        Place { parent: Some(self), step: Step::Index(index) }
    }

    pub(super) fn render(&self) -> String {
        let mut steps = Vec::new();
        let mut place = Some(self);
        while let Some(p) = place {
            steps.push(p.step);
            place = p.parent;
        }
        let mut out = String::new();
        for step in steps.iter().rev() {
            match step {
                Step::Root => {}
                Step::Field(name) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(name);
                }
                Step::Key(key) => {
                    let _ = write!(out, "[{key:?}]");
                }
                Step::Index(i) => {
                    let _ = write!(out, "[{i}]");
                }
            }
        }
        if out.is_empty() { "the top level".to_owned() } else { out }
    }

    pub(super) fn unwritable(&self, message: impl Into<String>) -> PickleError {
        PickleError::Unwritable { place: self.render(), message: message.into() }
    }
}

/// Where a container the reader types sits in the snapshot: a [`Place`] in a few bytes, kept
/// with the container and rendered only when something there is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum At {
    /// The snapshot dict (or, in a bare list of segments, that list).
    Root,
    Segments,
    Segment(u32),
    Blocks(u32),
    Block(u32, u32),
    PoolId(u32),
    /// The `frames` of a segment, block or entry.
    Stack(Owner),
    Frame(Owner, u32),
    DeviceTraces,
    Trace(u32),
    Entry(u32, u32),
    Settings,
    Divisions,
    Annotations,
    Annotation(u32),
}

/// What a frame list belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    Segment(u32),
    Block(u32, u32),
    Entry(u32, u32),
}

/// The last step of a place below an [`At`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Tail<'a> {
    Here,
    Field(&'a str),
    Key(&'a str),
    Index(usize),
}

/// A place the reader can name in an error: an [`At`] and one step more.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spot<'a> {
    pub(super) at: At,
    pub(super) tail: Tail<'a>,
}

impl At {
    /// Item `index` of the list here.
    #[inline]
    pub(super) fn item(self, index: usize) -> At {
        // Indices past 2^32 only occur in files too large to read; they only name places.
        let i = u32::try_from(index).unwrap_or(u32::MAX);
        match self {
            At::Segments => At::Segment(i),
            At::Blocks(s) => At::Block(s, i),
            At::Stack(owner) => At::Frame(owner, i),
            At::DeviceTraces => At::Trace(i),
            At::Trace(d) => At::Entry(d, i),
            At::Annotations => At::Annotation(i),
            other => other,
        }
    }

    /// The field of the dict here whose value the reader reads as `role`.
    #[inline]
    pub(super) fn child(self, role: super::stream::Role) -> At {
        use super::stream::Role;
        match (self, role) {
            (At::Root, Role::Segments) => At::Segments,
            (At::Root, Role::DeviceTraces) => At::DeviceTraces,
            (At::Root, Role::Settings) => At::Settings,
            (At::Root, Role::Annotations) => At::Annotations,
            (At::Segment(s), Role::Blocks) => At::Blocks(s),
            (At::Segment(s), Role::PoolId) => At::PoolId(s),
            (At::Segment(s), Role::Stack) => At::Stack(Owner::Segment(s)),
            (At::Block(s, b), Role::Stack) => At::Stack(Owner::Block(s, b)),
            (At::Entry(d, e), Role::Stack) => At::Stack(Owner::Entry(d, e)),
            (At::Settings, Role::Divisions) => At::Divisions,
            (other, _) => other,
        }
    }

    #[inline]
    pub(super) fn here(self) -> Spot<'static> {
        Spot { at: self, tail: Tail::Here }
    }

    pub(super) fn field(self, name: &str) -> Spot<'_> {
        Spot { at: self, tail: Tail::Field(name) }
    }

    pub(super) fn key(self, key: &str) -> Spot<'_> {
        Spot { at: self, tail: Tail::Key(key) }
    }

    #[inline]
    pub(super) fn nth(self, index: usize) -> Spot<'static> {
        Spot { at: self, tail: Tail::Index(index) }
    }

    /// Runs `f` with the place this names; `bare`: the file is a bare list of segments.
    fn with(self, bare: bool, f: &mut dyn FnMut(&Place<'_>)) {
        let root = Place::ROOT;
        let segments = if bare { root } else { root.field("segments") };
        let traces = root.field("device_traces");
        let settings = root.field("allocator_settings");
        let annotations = root.field("external_annotations");
        let at = |i: u32| i as usize;
        match self {
            At::Root => f(&root),
            At::Segments => f(&segments),
            At::Segment(s) => f(&segments.index(at(s))),
            At::Blocks(s) => f(&segments.index(at(s)).field("blocks")),
            At::Block(s, b) => f(&segments.index(at(s)).field("blocks").index(at(b))),
            At::PoolId(s) => f(&segments.index(at(s)).field("segment_pool_id")),
            At::Stack(owner) => owner.at().with(bare, &mut |p| f(&p.field("frames"))),
            At::Frame(owner, k) => owner.at().with(bare, &mut |p| f(&p.field("frames").index(at(k)))),
            At::DeviceTraces => f(&traces),
            At::Trace(d) => f(&traces.index(at(d))),
            At::Entry(d, e) => f(&traces.index(at(d)).index(at(e))),
            At::Settings => f(&settings),
            At::Divisions => f(&settings.field("roundup_power2_divisions")),
            At::Annotations => f(&annotations),
            At::Annotation(i) => f(&annotations.index(at(i))),
        }
    }
}

impl Owner {
    fn at(self) -> At {
        match self {
            Owner::Segment(s) => At::Segment(s),
            Owner::Block(s, b) => At::Block(s, b),
            Owner::Entry(d, e) => At::Entry(d, e),
        }
    }
}

impl Spot<'_> {
    /// The error `message` at this place; `bare` as in [`At::with`].
    pub(super) fn invalid(self, bare: bool, message: impl Into<String>) -> PickleError {
        let mut rendered = String::new();
        self.at.with(bare, &mut |place| {
            rendered = match self.tail {
                Tail::Here => place.render(),
                Tail::Field(name) => place.field(name).render(),
                Tail::Key(key) => place.key(key).render(),
                Tail::Index(i) => place.index(i).render(),
            }
        });
        PickleError::Invalid { place: rendered, message: message.into() }
    }
}
