//! Workspace-level integration tests live in this crate's `tests/` targets.
