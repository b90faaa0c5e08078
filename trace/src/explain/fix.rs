//! The fix, proven: the whole trace replayed under candidate changes, in parallel, and the
//! smallest change that lets the explained request and the rest of the job through.
//!
//! The candidates are `tune`'s ([`CandidateSearch::for_request`]: each searched key alone, the
//! two-part roundup tables only those split just below the request's size, then, only if none of
//! those is enough, the combinations of the best values), cachalot's own policy, an
//! `empty_cache()` call just before the request, and, where a memory fraction is set, the
//! smallest fraction that holds the job's peak without one. A change lets the job through when
//! its replay raises no out-of-memory error at the request or after it, and none anywhere that
//! PyTorch's run did not raise. "Smallest" is the fewest keys changed, a setting PyTorch accepts
//! before a call in the program before cachalot's own policy, then the lowest peak reserved.
//!
//! Each replay is a search's trial ([`replay_trial`]): no history, and a change's replay ends at
//! its first error that keeps the job from going through (it cannot be the fix; the combination
//! pass then ranks the failing values by how far the job got).
//!
//! Fractions below the job's own allowance (which `tune` tries, to save memory) are left out:
//! a lower cap never serves a request the device or a higher cap refused.

use std::borrow::Cow;
use std::time::Instant;

use rayon::prelude::*;

use cachalot_core::config::AllocatorConfig;
use cachalot_core::size::{allocation_size, round_size};
use cachalot_core::trace::{TraceAction, TraceEntry};

use super::ExplainError;
use crate::replay::{CallKind, ProgramCall, ReplayOom, ReplayOptions, ReplayOutcome, replay, replay_trial};
use crate::snapshot::torch::TorchSnapshot;
use crate::tune::{
    Candidate, CandidateSearch, Objective, keys_changed, own_policy_settings, split_own_keys, with_entries,
};

/// One change tried.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// A `PYTORCH_CUDA_ALLOC_CONF` PyTorch accepts (the whole value, the job's other keys kept).
    Settings {
        /// The value.
        settings: String,
    },
    /// cachalot's own policy (`policy:cachalot`) with the job's settings: needs cachalot as
    /// the allocator.
    OwnPolicy {
        /// The whole configuration.
        settings: String,
    },
    /// `torch.cuda.empty_cache()` called just before the request.
    EmptyCacheBefore {
        /// The trace entry of the request.
        entry: usize,
    },
    /// A larger memory fraction (`set_per_process_memory_fraction`).
    MemoryFraction {
        /// The fraction.
        fraction: f64,
    },
}

impl Change {
    /// How many keys or calls the change sets.
    fn keys(&self, own: &str) -> usize {
        match self {
            Change::Settings { settings } => keys_changed(own, settings).max(1),
            _ => 1,
        }
    }

    /// Settings before program calls before cachalot's own policy.
    fn kind_order(&self) -> u8 {
        match self {
            Change::Settings { .. } => 0,
            Change::MemoryFraction { .. } => 1,
            Change::EmptyCacheBefore { .. } => 2,
            Change::OwnPolicy { .. } => 3,
        }
    }
}

/// A change that lets the job through, and what its replay reached.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fix {
    /// The change.
    pub change: Change,
    /// Keys (or calls) it changes.
    pub keys_changed: usize,
    /// `max_memory_reserved()` of the whole replay under it.
    pub peak_reserved: u64,
    /// `max_memory_allocated()` of the whole replay under it.
    pub peak_allocated: u64,
}

/// What the search tried and found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FixSearch {
    /// Replays made (the trace's own settings included).
    pub replays: usize,
    /// Seconds the search took.
    pub seconds: f64,
    /// The smallest change that lets the job through, if any does.
    pub fix: Option<Fix>,
    /// Other changes that do, next smallest first (at most four).
    pub alternatives: Vec<Fix>,
    /// Whether the replay of the whole trace under its own settings fails there too. Where it
    /// does not (the whole replay served the request the stopped one refused), no change is
    /// proven and none is named.
    pub own_settings_fail: bool,
}

/// What the search needs to know of the request.
pub(crate) struct Target {
    /// The trace entry of the request.
    pub entry: usize,
    /// The first entry its malloc recorded (where an `empty_cache()` would go).
    pub cut: usize,
    /// Peak allocated and reserved up to the request, for `tune`'s grid.
    pub peaks: (u64, u64),
    /// Memory outside the allocator at the request (where a recorded error says).
    pub outside: u64,
    /// The request's size as the allocator rounded it (which roundup tables are tried).
    pub rounded: u64,
}

/// One replay to make.
struct Trial {
    change: Option<Change>,
    options: ReplayOptions,
    /// A trace of its own (one with a call added), else the job's.
    snapshot: Option<TorchSnapshot>,
    /// The explained request's index in the replayed trace.
    entry: usize,
}

struct Measured {
    change: Option<Change>,
    candidate: Candidate,
    lets_through: bool,
    outcome_calls: Vec<usize>,
}

fn run(snapshot: &TorchSnapshot, trials: Vec<Trial>) -> Result<Vec<Measured>, ExplainError> {
    trials
        .into_par_iter()
        .map(|trial| {
            let started = Instant::now();
            let replayed = trial.snapshot.as_ref().unwrap_or(snapshot);
            // A change fails at its first error that keeps the job from going through; the
            // replays of the job's own settings go on to the end (their inferred `empty_cache`
            // calls and their peak are read).
            let fails = |oom: &ReplayOom| trial.change.is_some() && !lets_through_at(oom, trial.entry);
            let outcome = replay_trial(replayed, &trial.options, &fails)?;
            let candidate =
                Candidate::measured(trial.options.config.settings(), &outcome, started.elapsed().as_secs_f64());
            Ok(Measured {
                lets_through: lets_job_through(&outcome, trial.entry),
                change: trial.change,
                candidate,
                outcome_calls: outcome.empty_cache_points,
            })
        })
        .collect()
}

/// Whether the replay `outcome` of a change (from [`rehearse`]) lets the job through from the
/// request at `entry` on: no out-of-memory error there or after, none PyTorch's run did not raise.
pub fn lets_job_through(outcome: &ReplayOutcome, entry: usize) -> bool {
    outcome.ooms.iter().all(|oom| lets_through_at(oom, entry))
}

/// Whether the error `oom` of a change's replay leaves the job through from the request at
/// `entry` on: one PyTorch raised too, before the request.
fn lets_through_at(oom: &ReplayOom, entry: usize) -> bool {
    oom.recorded && oom.index < entry
}

/// The job as the candidates replay it. At a recorded out-of-memory error the replay gives
/// the simulator the free memory the driver reported, which was the recorded run's: under a
/// change that reserves less, the device would have had more. So the memory outside the
/// allocator at the explained error (`Target::outside`) is taken off the device instead, and
/// the recorded errors from the explained one on become requests served and freed at once (as
/// the replay treats a recorded error it serves): a change lets them through only if the device
/// less that memory holds them. A memory fraction is scaled to keep its allowance in bytes.
struct Rehearsal {
    snapshot: TorchSnapshot,
    options: ReplayOptions,
    /// The recorded device's total over the rehearsal's.
    scale: f64,
}

impl Rehearsal {
    fn new(snapshot: &TorchSnapshot, options: &ReplayOptions, target: &Target) -> Self {
        let trace = snapshot.device_traces.get(options.device).map_or(&[][..], Vec::as_slice);
        let trace = &chain_completions_left_pending(trace, target.entry);
        let mut converted = Vec::with_capacity(trace.len());
        let mut moved = Vec::new();
        for (i, e) in trace.iter().enumerate() {
            if e.action == TraceAction::Oom && i >= target.entry {
                // An address no device gives: the request's own, for its free.
                let addr = (1 << 63) | i as u64;
                moved.push(i);
                for action in [TraceAction::Alloc, TraceAction::FreeRequested, TraceAction::FreeCompleted] {
                    converted.push(TraceEntry { action, addr, ..*e });
                }
            } else {
                converted.push(*e);
            }
        }
        let mut rehearsed = TorchSnapshot {
            device_traces: snapshot.device_traces.iter().map(|_| Vec::new()).collect(),
            allocator_settings: snapshot.allocator_settings.clone(),
            contexts: snapshot.contexts.clone(),
            ..TorchSnapshot::default()
        };
        if let Some(slot) = rehearsed.device_traces.get_mut(options.device) {
            *slot = converted;
        }
        // Each converted error before a call's place adds two entries.
        let shifted = |at: usize| at + 2 * moved.partition_point(|&m| m < at);
        let calls = options
            .calls
            .as_ref()
            .map(|calls| calls.iter().map(|c| ProgramCall { call: c.call, at: shifted(c.at) }).collect::<Vec<_>>());
        let total = options.device_total.max(1);
        let device_total = total.saturating_sub(target.outside).max(1);
        Rehearsal {
            snapshot: rehearsed,
            options: ReplayOptions { device_total, calls, record_calls: false, ..options.clone() },
            scale: total as f64 / device_total as f64,
        }
    }

    /// The options of a replay under `settings`, with `fraction` in place of the settings' and
    /// the job's own where given (`Some(None)`: no fraction).
    fn options(&self, settings: &str, fraction: Option<Option<f64>>) -> Result<ReplayOptions, ExplainError> {
        let config = AllocatorConfig::parse(settings)
            .map_err(|error| ExplainError::Candidate { settings: settings.to_owned(), error })?;
        let configured = config.per_process_memory_fraction();
        let fraction = fraction
            .unwrap_or(self.options.memory_fraction.or((configured < 1.0).then_some(configured)))
            .map(|f| (f * self.scale).min(1.0));
        Ok(ReplayOptions { config, memory_fraction: fraction, ..self.options.clone() })
    }
}

/// `trace` with the deferred completions recorded by each failing malloc from `entry` on
/// (those its retry chain's synchronization made) turned into `snapshot` marks put first in
/// the malloc's entries, which keeps every index. As the explanation's stopped replay, the
/// rehearsal then leaves those frees pending when the request comes: a change is not credited
/// with a block that only the failing malloc's own synchronization freed (PyTorch's retry then
/// asks the device for a new segment and never looks at it). They complete at the next
/// synchronization (a full release, an `empty_cache`), as a replay that knows the program's
/// calls treats a retry chain's completions.
fn chain_completions_left_pending(trace: &[TraceEntry], entry: usize) -> Cow<'_, [TraceEntry]> {
    let mut entries = Cow::Borrowed(trace);
    for (i, e) in trace.iter().enumerate().skip(entry).filter(|(_, e)| e.action == TraceAction::Oom) {
        let start = super::stop::malloc_start(trace, i);
        if !trace[start..i].iter().any(|n| n.action == TraceAction::FreeCompleted) {
            continue;
        }
        let run = &mut entries.to_mut()[start..i];
        let marks = run.iter().filter(|n| n.action == TraceAction::FreeCompleted).count();
        let rest: Vec<TraceEntry> = run.iter().filter(|n| n.action != TraceAction::FreeCompleted).copied().collect();
        let mark =
            TraceEntry { action: TraceAction::Snapshot, size: 0, addr: 0, context: None, annotation: None, ..*e };
        for (slot, n) in run.iter_mut().zip(std::iter::repeat_n(mark, marks).chain(rest)) {
            *slot = n;
        }
    }
    entries
}

impl Rehearsal {
    /// The replay of `change` for the request `target`; `inferred` are the `empty_cache` calls
    /// the replay of the job's own settings inferred (for [`Change::EmptyCacheBefore`]).
    fn trial(&self, change: Change, target: &Target, inferred: &[usize]) -> Result<Trial, ExplainError> {
        let options = match &change {
            Change::Settings { settings } | Change::OwnPolicy { settings } => self.options(settings, None)?,
            Change::MemoryFraction { fraction } => {
                let own = self.options.config.settings();
                self.options(&with_entries(own, "per_process_memory_fraction:1"), Some(Some(*fraction)))?
            }
            Change::EmptyCacheBefore { .. } => {
                return Ok(with_empty_cache(&self.snapshot, &self.options, target, inferred).unwrap_or(Trial {
                    change: None,
                    options: self.options.clone(),
                    snapshot: None,
                    entry: target.entry,
                }));
            }
        };
        Ok(Trial { change: Some(change), options, snapshot: None, entry: target.entry })
    }
}

/// Replays `snapshot`'s job under `change` as the fix search does for the request `x`
/// explained under `options`: to see a proposed fix through again (the search's proof).
pub fn rehearse(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    x: &super::Explanation,
    change: &Change,
) -> Result<ReplayOutcome, ExplainError> {
    let trace = snapshot.device_traces.get(options.device).map_or(&[][..], Vec::as_slice);
    let target = Target {
        entry: x.entry,
        cut: super::stop::malloc_start(trace, x.entry.min(trace.len())),
        peaks: (0, 0),
        outside: x.memory.outside,
        rounded: x.request.rounded,
    };
    let rehearsal = Rehearsal::new(snapshot, options, &target);
    let inferred = match change {
        Change::EmptyCacheBefore { .. } if options.calls.is_none() => {
            replay(&rehearsal.snapshot, &rehearsal.options, |_, _| {})?.empty_cache_points
        }
        _ => Vec::new(),
    };
    let trial = rehearsal.trial(change.clone(), &target, &inferred)?;
    Ok(replay(trial.snapshot.as_ref().unwrap_or(&rehearsal.snapshot), &trial.options, |_, _| {})?)
}

/// Searches for the fix of the request `target`, replaying `snapshot` under `options` (the
/// job's own) and the candidates.
pub(crate) fn search(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    target: &Target,
) -> Result<FixSearch, ExplainError> {
    let started = Instant::now();
    let own = options.config.settings().to_owned();
    let (pytorch, _) = split_own_keys(&own);
    let pytorch_options = ReplayOptions {
        config: AllocatorConfig::parse(&pytorch)
            .map_err(|error| ExplainError::Candidate { settings: pytorch.clone(), error })?,
        ..options.clone()
    };
    let rehearsal = Rehearsal::new(snapshot, options, target);
    let baseline = Candidate {
        settings: pytorch.clone(),
        peak_reserved: target.peaks.1,
        peak_allocated: target.peaks.0,
        ooms: 0,
        new_ooms: 0,
        first_oom: None,
        first_new_oom: None,
        device_allocs: 0,
        device_frees: 0,
        allocator_seconds: 0.0,
    };
    let candidates = CandidateSearch::for_request(snapshot, &pytorch_options, &baseline, target.rounded);
    let first_pass = candidates.first_pass();
    let trial = |change: Change| rehearsal.trial(change, target, &[]);

    // The job's own settings first, then tune's first pass, then the rest.
    let mut trials =
        vec![Trial { change: None, options: rehearsal.options(&own, None)?, snapshot: None, entry: target.entry }];
    // Each candidate as a change to the job's own settings (tune's set only the keys they vary).
    let mut tried = std::collections::BTreeSet::from([pytorch.clone()]);
    let as_change = |candidate: &str| with_entries(&pytorch, candidate);
    let unchanged = Unchanged::of(snapshot, options, &own, &pytorch);
    for candidate in &first_pass {
        let settings = as_change(candidate);
        if unchanged.by(&settings) {
            continue;
        }
        if !candidate.contains("per_process_memory_fraction:") && tried.insert(settings.clone()) {
            trials.push(trial(Change::Settings { settings: settings.clone() })?);
        }
    }
    if options.config.policy() == cachalot_core::Policy::PyTorch {
        let settings = own_policy_settings(&own);
        trials.push(trial(Change::OwnPolicy { settings: settings.clone() })?);
    }
    let capped = options.memory_fraction.is_some() || options.config.per_process_memory_fraction() < 1.0;
    // The fraction of the settings gives way to the one the replay sets (`memory_fraction`).
    let uncapped_settings = with_entries(&own, "per_process_memory_fraction:1");
    if capped {
        let uncapped = rehearsal.options(&uncapped_settings, Some(None))?;
        trials.push(Trial { change: None, options: uncapped, snapshot: None, entry: target.entry });
    }
    let snapshot = &rehearsal.snapshot;
    let mut measured = run(snapshot, trials)?;
    let mut replays = measured.len();
    let own_settings_fail = !measured[0].lets_through;
    if !own_settings_fail {
        // The whole replay serves what the stopped one refused: no replay can prove a change.
        return Ok(FixSearch {
            replays,
            seconds: started.elapsed().as_secs_f64(),
            fix: None,
            alternatives: Vec::new(),
            own_settings_fail,
        });
    }

    // Second batch: what needs the first's results.
    let mut second = Vec::new();
    let emptied =
        rehearsal.trial(Change::EmptyCacheBefore { entry: target.entry }, target, &measured[0].outcome_calls)?;
    if emptied.change.is_some() {
        second.push(emptied);
    }
    if capped && let Some(uncapped) = measured.last().filter(|m| m.change.is_none() && m.lets_through) {
        let total = options.device_total.max(1) as f64;
        // Four decimals, rounded up: the allowance then holds the uncapped run's peak.
        let fraction = ((uncapped.candidate.peak_reserved as f64 / total) * 1e4).ceil() / 1e4;
        if fraction < 1.0 {
            second.push(rehearsal.trial(Change::MemoryFraction { fraction }, target, &[])?);
        }
    }
    replays += second.len();
    measured.extend(run(snapshot, second)?);

    if !measured.iter().any(|m| m.change.is_some() && m.lets_through) {
        // No single change is enough: tune's combinations of the best values of each key, the
        // best by how few errors they leave.
        let results: Vec<Option<Candidate>> = first_pass
            .iter()
            .map(|candidate| {
                let settings = as_change(candidate);
                measured
                    .iter()
                    .find(|m| matches!(&m.change, Some(Change::Settings { settings: s }) if *s == settings))
                    .map(|m| m.candidate.clone())
            })
            .collect();
        let mut combined = Vec::new();
        for candidate in candidates.second_pass(&results, Objective::Ooms) {
            let settings = as_change(&candidate);
            if !candidate.contains("per_process_memory_fraction:") && tried.insert(settings.clone()) {
                combined.push(trial(Change::Settings { settings: settings.clone() })?);
            }
        }
        replays += combined.len();
        measured.extend(run(snapshot, combined)?);
    }

    let mut fixes: Vec<Fix> = measured
        .into_iter()
        .filter(|m| m.lets_through)
        .filter_map(|m| {
            let change = m.change?;
            Some(Fix {
                keys_changed: change.keys(&own),
                change,
                peak_reserved: m.candidate.peak_reserved,
                peak_allocated: m.candidate.peak_allocated,
            })
        })
        .collect();
    fixes.sort_by_key(|f| (f.keys_changed, f.change.kind_order(), f.peak_reserved));
    let mut fixes = fixes.into_iter();
    let fix = fixes.next();
    Ok(FixSearch {
        replays,
        seconds: started.elapsed().as_secs_f64(),
        fix,
        alternatives: fixes.take(4).collect(),
        own_settings_fail,
    })
}

/// What a `max_split_size_mb` added to the job's own settings cannot change: where those
/// settings have no limit and no expandable segments, a limit above the largest segment they
/// make for any request of the trace leaves every block below it, so no oversize rule ever
/// applies and the oversize release finds nothing to release. The replay would be the job's
/// own, which fails, so it is not made.
struct Unchanged {
    /// The job's own settings, where the rule applies to them.
    own: Option<String>,
    /// The largest segment those settings make for a request of the trace.
    largest_segment: u64,
}

impl Unchanged {
    fn of(snapshot: &TorchSnapshot, options: &ReplayOptions, own: &str, pytorch: &str) -> Self {
        let config = &options.config;
        // With cachalot's own policy in the settings, the candidates' baseline is not the job's.
        let applies = own == pytorch && config.max_split_size().is_none() && !config.expandable_segments();
        let trace = snapshot.device_traces.get(options.device).map_or(&[][..], Vec::as_slice);
        let requests = trace.iter().filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom));
        let segment =
            |size| allocation_size(round_size(size, config.roundup_power2_divisions()), config.large_segment_size());
        let largest_segment = requests.map(|e| segment(e.size)).max().unwrap_or(0);
        Unchanged { own: applies.then(|| own.to_owned()), largest_segment }
    }

    /// Whether `settings` are the job's own with only a `max_split_size_mb` that changes nothing.
    fn by(&self, settings: &str) -> bool {
        let Some(own) = &self.own else { return false };
        if keys_changed(own, settings) != 1 {
            return false;
        }
        let limit = AllocatorConfig::parse(settings).ok().and_then(|c| c.max_split_size());
        limit.is_some_and(|limit| limit > self.largest_segment)
    }
}

/// The trial with `empty_cache()` called just before the request: the trace gets a `snapshot`
/// entry there, as a capture records one before each call, and the replay is told the
/// program's calls. Where the job's calls were not known, the `empty_cache` calls its replay
/// inferred (`inferred`) are given too, so that knowing the calls changes nothing else.
fn with_empty_cache(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    target: &Target,
    inferred: &[usize],
) -> Option<Trial> {
    let trace = snapshot.device_traces.get(options.device)?;
    let mut points: Vec<usize> = match &options.calls {
        Some(_) => vec![target.cut],
        None => inferred.iter().copied().chain([target.cut]).collect(),
    };
    points.sort_unstable();
    points.dedup();
    // An old index's place once a marker is inserted before each point at or below it.
    let shifted = |index: usize| index + points.partition_point(|&p| p <= index);
    let mut marked = Vec::with_capacity(trace.len() + points.len());
    let mut next = points.iter().peekable();
    for (i, entry) in trace.iter().enumerate() {
        while next.next_if(|&&p| p == i).is_some() {
            marked.push(TraceEntry {
                action: TraceAction::Snapshot,
                size: 0,
                addr: 0,
                context: None,
                annotation: None,
                ..*entry
            });
        }
        marked.push(*entry);
    }
    let marker = |point: usize| point + points.partition_point(|&p| p < point);
    let mut calls: Vec<ProgramCall> = match &options.calls {
        Some(calls) => calls.iter().map(|c| ProgramCall { call: c.call, at: shifted(c.at) }).collect(),
        None => inferred.iter().map(|&p| ProgramCall { call: CallKind::EmptyCache, at: marker(p) }).collect(),
    };
    calls.push(ProgramCall { call: CallKind::EmptyCache, at: marker(target.cut) });
    calls.sort_by_key(|c| c.at);
    let mut replayed = TorchSnapshot {
        device_traces: snapshot.device_traces.iter().map(|_| Vec::new()).collect(),
        allocator_settings: snapshot.allocator_settings.clone(),
        contexts: snapshot.contexts.clone(),
        ..TorchSnapshot::default()
    };
    replayed.device_traces[options.device] = marked;
    Some(Trial {
        change: Some(Change::EmptyCacheBefore { entry: target.entry }),
        options: ReplayOptions { calls: Some(calls), record_calls: false, ..options.clone() },
        snapshot: Some(replayed),
        entry: shifted(target.entry),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;
    use cachalot_core::StreamId;

    const MIB: u64 = 1 << 20;

    /// A limit above the largest segment the job's requests make is not replayed; one at or
    /// below it, another key with it, or settings with a limit or pages of their own are.
    #[test]
    fn a_split_limit_above_every_segment_changes_nothing() {
        let entry = |action, size| TraceEntry {
            action,
            addr: 0,
            size,
            stream: StreamId(0),
            time_us: 0,
            context: None,
            annotation: None,
        };
        let snapshot = TorchSnapshot {
            device_traces: vec![vec![entry(TraceAction::Alloc, 3 * MIB), entry(TraceAction::Oom, 30 * MIB + 1)]],
            ..TorchSnapshot::default()
        };
        let unchanged = |own: &str| {
            let options = ReplayOptions { config: AllocatorConfig::parse(own).unwrap(), ..replay_options() };
            Unchanged::of(&snapshot, &options, own, own)
        };
        // The 30 MiB + 1 B request's segment is 32 MiB.
        assert_eq!(unchanged("").largest_segment, 32 * MIB);
        assert!(unchanged("").by("max_split_size_mb:48"));
        assert!(!unchanged("").by("max_split_size_mb:32"));
        assert!(!unchanged("").by("max_split_size_mb:64,roundup_power2_divisions:4"));
        assert!(!unchanged("expandable_segments:True").by("expandable_segments:True,max_split_size_mb:64"));
        assert!(!unchanged("max_split_size_mb:40").by("max_split_size_mb:64"));
        let options = replay_options();
        assert!(!Unchanged::of(&snapshot, &options, "policy:cachalot", "").by("max_split_size_mb:64"));
    }

    fn replay_options() -> ReplayOptions {
        ReplayOptions::for_snapshot(
            &TorchSnapshot { device_traces: vec![Vec::new()], ..TorchSnapshot::default() },
            None,
        )
        .unwrap()
    }
}
