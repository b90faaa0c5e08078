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
    pub(super) fn field(&'a self, name: &'a str) -> Place<'a> {
        Place { parent: Some(self), step: Step::Field(name) }
    }

    /// An entry of a dict keyed by data (`["1"]`).
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

    pub(super) fn invalid(&self, message: impl Into<String>) -> PickleError {
        PickleError::Invalid { place: self.render(), message: message.into() }
    }

    pub(super) fn unwritable(&self, message: impl Into<String>) -> PickleError {
        PickleError::Unwritable { place: self.render(), message: message.into() }
    }
}
