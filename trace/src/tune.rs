//! Which `PYTORCH_CUDA_ALLOC_CONF` a recorded job needs (`cachalot tune`): the trace is replayed
//! under candidate settings, each exactly (the replay of a PyTorch trace is byte-exact, so a
//! candidate's peak is the peak PyTorch would reach with that setting), and the candidates are
//! ranked by an [`Objective`].
//!
//! # How the search is organised
//!
//! The keys searched are those of PyTorch 2.11 that change where memory goes:
//! `expandable_segments`, `max_split_size_mb`, `roundup_power2_divisions` (single values and
//! per-interval `[MB:N,>:N]` tables), `garbage_collection_threshold` and
//! `per_process_memory_fraction`. Other keys of the trace's own settings are kept in every
//! candidate, so the winning line can replace the job's setting as it is, except cachalot's own
//! `policy` key: PyTorch refuses it, so it is dropped from the baseline and every candidate
//! ([`Tuning::dropped`] names it). cachalot's own policy is not one of PyTorch's settings, so it is
//! never ranked: [`tune`] replays the trace's settings under it beside the search, in parallel with
//! it, as [`Tuning::own_policy`], so that a user sees what it would save on their job beside
//! PyTorch's best. Trying every
//! combination of every value would be tens of thousands of replays, so the search runs in
//! two passes, each replayed in parallel on every core (candidates are independent replays):
//!
//! 1. **Each key alone**, on top of the kept keys: every value of the key's grid. The fraction
//!    and the collection threshold are one dimension, because the threshold only acts below a
//!    fraction of 1: without a fraction of the job's own, a threshold is tried with each
//!    fraction of the grid, never alone.
//! 2. **Combinations** of the best values per key: the best [`BEST_PER_KEY`] values of each
//!    dimension in the first pass (values with the same outcome count once), and the key unset,
//!    in every combination of at least two keys.
//!
//! Values that cannot change the replay are not tried (pruning):
//! - a `max_split_size_mb` above the largest segment any request of the trace can need (its
//!   rounding with two divisions at most doubles it): no block of an ordinary segment is ever
//!   that large, so no block would be oversize;
//! - a `roundup_power2_divisions` table that rounds every request of the trace like another
//!   candidate's table or like the default (the tables agree on every size interval the trace
//!   has requests in, 0 and 1 both meaning plain rounding);
//! - `expandable_segments:False`, the default;
//! - a fraction whose allowance is at least the trace's own peak reserved (a cap that is never
//!   reached), and any fraction when the job sets its own with
//!   `torch.cuda.set_per_process_memory_fraction`, which overrides the configured one.
//!
//! A candidate whose replay runs out of memory where PyTorch's run did not ("new OOMs") always
//! ranks below every candidate without: a setting that makes the job fail is never an
//! improvement, whatever its peak.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::Instant;

use rayon::prelude::*;

use crate::replay::{ReplayError, ReplayOom, ReplayOptions, ReplayOutcome, replay_trial};
use crate::snapshot::torch::TorchSnapshot;
use cachalot_core::config::{AllocatorConfig, ConfigError};
use cachalot_core::size::{MAX_REQUEST, MIB, ROUNDUP_INTERVALS, allocation_size};
use cachalot_core::trace::TraceAction;

/// How many values of each key the combination pass takes from the first pass.
pub const BEST_PER_KEY: usize = 3;

/// `max_split_size_mb` values tried (those below the minimum `large_segment_size_mb` allows and
/// above the trace's largest segment are left out): steps of about 1.5×.
const MAX_SPLIT_GRID_MB: [u64; 17] =
    [20, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192];

/// `roundup_power2_divisions` values tried, as single values and on each side of a per-interval
/// table (1 is plain rounding, allowed in a table only).
const SINGLE_DIVISIONS: [u64; 5] = [2, 4, 8, 16, 32];
const TABLE_DIVISIONS: [u64; 5] = [1, 2, 4, 8, 16];

/// Where a fraction's allowance is put between the trace's own peak allocated (0) and peak
/// reserved (1).
const FRACTION_STEPS: [f64; 4] = [0.125, 0.25, 0.5, 0.75];

/// `garbage_collection_threshold` values tried.
const GC_THRESHOLDS: [&str; 5] = ["0.5", "0.6", "0.7", "0.8", "0.9"];

/// The keys the search sets; every other key of the trace's settings is kept as it is.
const SEARCHED_KEYS: [&str; 5] = [
    "expandable_segments",
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
];

/// What the ranking minimises first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// The peak of reserved memory (`max_memory_reserved()`), then fewer OOMs.
    PeakReserved,
    /// The number of OOM errors, then the peak reserved.
    Ooms,
    /// Device allocations plus frees (`cudaMalloc` / `cudaFree` calls), then the peak reserved.
    DeviceCalls,
}

impl Objective {
    /// Every objective, in the order the help lists them.
    pub const ALL: [Objective; 3] = [Objective::PeakReserved, Objective::Ooms, Objective::DeviceCalls];

    /// The name on the command line (`peak-reserved`, `ooms`, `device-calls`).
    pub fn name(self) -> &'static str {
        match self {
            Objective::PeakReserved => "peak-reserved",
            Objective::Ooms => "ooms",
            Objective::DeviceCalls => "device-calls",
        }
    }

    /// The objective called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// What the replay of one candidate setting measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Candidate {
    /// The `PYTORCH_CUDA_ALLOC_CONF` value.
    pub settings: String,
    /// `max_memory_reserved()` at the end of the replay.
    pub peak_reserved: u64,
    /// `max_memory_allocated()` at the end of the replay.
    pub peak_allocated: u64,
    /// Every OOM error the replay raised.
    pub ooms: usize,
    /// OOM errors where PyTorch's run served the request.
    pub new_ooms: usize,
    /// The first OOM error, if any.
    pub first_oom: Option<ReplayOom>,
    /// The first OOM error where PyTorch's run served the request, if any.
    pub first_new_oom: Option<ReplayOom>,
    /// `num_device_alloc` of `memory_stats()`.
    pub device_allocs: u64,
    /// `num_device_free` of `memory_stats()`.
    pub device_frees: u64,
    /// Seconds the replay took (the allocator's work plus the replay's bookkeeping).
    pub allocator_seconds: f64,
}

impl Candidate {
    /// Peak reserved over peak allocated: 1 is no waste at the worst moment.
    pub fn reserved_per_allocated(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_allocated.max(1) as f64
    }

    /// Device allocations plus frees.
    pub fn device_calls(&self) -> u64 {
        self.device_allocs + self.device_frees
    }

    /// Whether the job runs through: no OOM where PyTorch's run had none.
    pub fn fits(&self) -> bool {
        self.new_ooms == 0
    }

    /// Smaller is better. New OOMs come first, so that a candidate with any ranks below all
    /// without; among those with, fewer and later is better.
    fn rank_key(&self, objective: Objective) -> (usize, Reverse<usize>, u64, u64, u64) {
        let failing = (self.new_ooms, Reverse(self.first_new_oom.as_ref().map_or(usize::MAX, |o| o.index)));
        let (peak, ooms, calls) = (self.peak_reserved, self.ooms as u64, self.device_calls());
        let measured = match objective {
            Objective::PeakReserved => (peak, ooms, calls),
            Objective::Ooms => (ooms, peak, calls),
            Objective::DeviceCalls => (calls, peak, ooms),
        };
        (failing.0, failing.1, measured.0, measured.1, measured.2)
    }
}

/// The result of a search.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Tuning {
    /// What the ranking minimised.
    pub objective: Objective,
    /// Total memory of the device replayed on.
    pub device_total: u64,
    /// The trace's own settings, replayed as they are but for the entries in `dropped`.
    pub baseline: Candidate,
    /// Entries of the trace's settings left out of the baseline and of every candidate because
    /// PyTorch refuses them: cachalot's own `policy` key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// Every candidate, the baseline included, best first; ties keep the order of the search
    /// (the baseline first). All are settings PyTorch accepts.
    pub ranked: Vec<Candidate>,
    /// The trace's own settings under cachalot's own policy (`policy:cachalot`): not a setting
    /// PyTorch accepts, so never in `ranked`. [`tune`] and [`Tuning::with_own_policy`] set it,
    /// unless its replay failed ([`Tuning::own_policy_error`]); [`tune_pytorch_settings`] does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_policy: Option<Candidate>,
    /// Why the replay under cachalot's own policy failed, when [`tune`] tried it and it did: the
    /// ranking of PyTorch's settings stands without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_policy_error: Option<String>,
}

impl Tuning {
    /// The best candidate.
    pub fn winner(&self) -> &Candidate {
        self.ranked.first().unwrap_or(&self.baseline)
    }

    /// The 1-based rank of the trace's own settings.
    pub fn baseline_rank(&self) -> usize {
        self.ranked.iter().position(|c| c.settings == self.baseline.settings).map_or(self.ranked.len(), |i| i + 1)
    }

    /// The best candidate that runs through (no OOM where PyTorch's run had none), if any.
    pub fn best_fitting(&self) -> Option<&Candidate> {
        self.ranked.iter().find(|c| c.fits())
    }

    /// Adds the replay of the trace's own settings under cachalot's own policy
    /// ([`OWN_POLICY`]), one more replay, to set beside PyTorch's best: what the job would need
    /// with cachalot as its allocator. [`tune`] does this already, alongside its search; this is
    /// for a search of [`tune_pytorch_settings`].
    pub fn with_own_policy(mut self, snapshot: &TorchSnapshot, options: &ReplayOptions) -> Result<Self, TuneError> {
        let settings = own_policy_settings(options.config.settings());
        self.own_policy = Some(measure(snapshot, options, &settings)?);
        self.own_policy_error = None;
        Ok(self)
    }
}

/// The key and value that select cachalot's own policy (`docs/allocator-rules.md` §24).
pub const OWN_POLICY: &str = "policy:cachalot";

/// How `memory_allocated()` reads under cachalot's own policy, for whoever sets its figures
/// beside PyTorch's (rules 1–2 of `docs/allocator-rules.md` §24).
pub const OWN_POLICY_ALLOCATED: &str = "memory_allocated() differs from PyTorch's under it: remainders \
     of 512 B or more are split off, so an allocation counts its request rounded up to 512 B, not \
     the block PyTorch's rounding and splitting give it";

/// cachalot's own key, which PyTorch refuses ("Unrecognized key 'policy' in CUDA allocator
/// config.").
const POLICY_KEY: &str = "policy";

/// `settings` without cachalot's own `policy` entries, and those entries: the part PyTorch
/// accepts and the part it refuses.
pub fn split_own_keys(settings: &str) -> (String, Vec<String>) {
    let (own, pytorch): (Vec<String>, Vec<String>) =
        all_entries(settings).into_iter().partition(|entry| entry_key(entry) == POLICY_KEY);
    (pytorch.join(","), own)
}

/// The key of a `key:value` entry, trimmed.
fn entry_key(entry: &str) -> &str {
    entry.split(':').next().unwrap_or("").trim()
}

/// `settings` with cachalot's own policy selected instead of any `policy` entry it has.
pub fn own_policy_settings(settings: &str) -> String {
    let (pytorch, _) = split_own_keys(settings);
    if pytorch.is_empty() { OWN_POLICY.to_owned() } else { format!("{pytorch},{OWN_POLICY}") }
}

/// A search that could not run.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The trace cannot be replayed at all (no trace for the device, a device size no device
    /// has, an allocator that cannot be set up): its replay under its own settings failed.
    #[error("{0}")]
    Trace(ReplayError),
    /// A candidate's replay failed.
    #[error("{settings:?}: {error}")]
    Replay {
        /// The candidate setting.
        settings: String,
        /// Why.
        error: ReplayError,
    },
    /// A candidate setting did not parse: a bug of the search, named so it can be reported.
    #[error("the search made a setting that does not parse, {settings:?}: {error}")]
    Candidate {
        /// The setting.
        settings: String,
        /// Why it does not parse.
        error: ConfigError,
    },
}

/// Replays `snapshot` under its own settings (`options`) and under the candidates of the search,
/// ranks them by `objective`, and replays the trace's settings under cachalot's own policy
/// beside them ([`Tuning::own_policy`], [`own_policy_settings`]), in parallel with the search.
/// `options.device_total` is the device replayed on. Settings that select cachalot's own policy
/// are searched as PyTorch's settings (the `policy` entry dropped).
///
/// A trace that cannot be replayed at all is an error; one that replays under PyTorch's policy
/// but not under cachalot's still gets its ranking, with [`Tuning::own_policy_error`] saying why.
pub fn tune(snapshot: &TorchSnapshot, options: &ReplayOptions, objective: Objective) -> Result<Tuning, TuneError> {
    let own_settings = own_policy_settings(options.config.settings());
    let (tuning, own) = rayon::join(
        || tune_pytorch_settings(snapshot, options, objective),
        || measure(snapshot, options, &own_settings),
    );
    let mut tuning = tuning?;
    match own {
        Ok(own) => tuning.own_policy = Some(own),
        Err(error) => tuning.own_policy_error = Some(error.to_string()),
    }
    Ok(tuning)
}

/// [`tune`] without cachalot's own policy: the search of PyTorch's settings alone, one replay
/// fewer ([`Tuning::own_policy`] stays `None`).
pub fn tune_pytorch_settings(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    objective: Objective,
) -> Result<Tuning, TuneError> {
    let (pytorch_settings, dropped) = split_own_keys(options.config.settings());
    let pytorch_options;
    let options = if dropped.is_empty() {
        options
    } else {
        let config = AllocatorConfig::parse(&pytorch_settings)
            .map_err(|error| TuneError::Candidate { settings: pytorch_settings.clone(), error })?;
        pytorch_options = ReplayOptions { config, ..options.clone() };
        &pytorch_options
    };
    let space = SearchSpace::of(snapshot, options);
    let baseline = measure(snapshot, options, options.config.settings()).map_err(|e| match e {
        TuneError::Replay { error, .. } => TuneError::Trace(error),
        other => other,
    })?;
    let mut tried: BTreeSet<String> = BTreeSet::from([baseline.settings.clone()]);
    let mut ranked = vec![baseline.clone()];

    let singles: Vec<Choice> = space.single_key_choices(&baseline);
    let single_results = measure_all(snapshot, options, &space, &singles, &mut tried)?;
    let combinations = space.combinations(&singles, &single_results, objective);
    let combination_results = measure_all(snapshot, options, &space, &combinations, &mut tried)?;

    ranked.extend(single_results.into_iter().flatten());
    ranked.extend(combination_results.into_iter().flatten());
    rank(&mut ranked, objective);
    Ok(Tuning {
        objective,
        device_total: options.device_total,
        baseline,
        dropped,
        ranked,
        own_policy: None,
        own_policy_error: None,
    })
}

/// Sorts best first; the sort is stable, so ties keep the search's order.
pub fn rank(candidates: &mut [Candidate], objective: Objective) {
    candidates.sort_by_key(|c| c.rank_key(objective));
}

/// Replays the choices not tried yet, in parallel; `None` for those tried before.
fn measure_all(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    space: &SearchSpace,
    choices: &[Choice],
    tried: &mut BTreeSet<String>,
) -> Result<Vec<Option<Candidate>>, TuneError> {
    let settings: Vec<Option<String>> =
        choices.iter().map(|c| space.settings(c)).map(|s| tried.insert(s.clone()).then_some(s)).collect();
    settings.par_iter().map(|s| s.as_deref().map(|s| measure(snapshot, options, s)).transpose()).collect()
}

/// Replays the trace under `settings`.
fn measure(snapshot: &TorchSnapshot, options: &ReplayOptions, settings: &str) -> Result<Candidate, TuneError> {
    let config = AllocatorConfig::parse(settings)
        .map_err(|error| TuneError::Candidate { settings: settings.to_owned(), error })?;
    let options = ReplayOptions { config, ..options.clone() };
    let started = Instant::now();
    let outcome = replay_trial(snapshot, &options, &|_| false)
        .map_err(|error| TuneError::Replay { settings: settings.to_owned(), error })?;
    Ok(Candidate::measured(settings, &outcome, started.elapsed().as_secs_f64()))
}

impl Candidate {
    /// What the replay of `settings` that produced `outcome` in `seconds` measured.
    pub fn measured(settings: &str, outcome: &ReplayOutcome, seconds: f64) -> Candidate {
        let stats = outcome.allocator.stats();
        Candidate {
            settings: settings.to_owned(),
            peak_reserved: stats.max_memory_reserved(),
            peak_allocated: stats.max_memory_allocated(),
            ooms: outcome.ooms.len(),
            new_ooms: outcome.ooms.iter().filter(|o| !o.recorded).count(),
            first_oom: outcome.ooms.first().cloned(),
            first_new_oom: outcome.ooms.iter().find(|o| !o.recorded).cloned(),
            device_allocs: stats.num_device_alloc,
            device_frees: stats.num_device_free,
            allocator_seconds: seconds,
        }
    }
}

/// The search's candidates for a caller that replays them itself and judges them by more than
/// a ranking (`explain`, which needs each replay's every OOM): the same two passes as [`tune`],
/// over the same pruned values. `options` are the trace's own, with no `policy` entry
/// ([`split_own_keys`]).
#[derive(Clone, Debug)]
pub struct CandidateSearch {
    space: SearchSpace,
    singles: Vec<Choice>,
}

impl CandidateSearch {
    /// The search for `snapshot`'s trace; `baseline` is what the trace's own settings measured
    /// (the fractions tried lie between its peak allocated and its peak reserved).
    pub fn new(snapshot: &TorchSnapshot, options: &ReplayOptions, baseline: &Candidate) -> Self {
        let space = SearchSpace::of(snapshot, options);
        let singles = space.single_key_choices(baseline);
        CandidateSearch { space, singles }
    }

    /// [`CandidateSearch::new`] for one request of `size` bytes (`explain`'s fix search): the
    /// two-part `roundup_power2_divisions` tables are only those split just below the request's
    /// interval (the request and the larger ones rounded apart from the smaller ones; at the
    /// first interval, the request and the smaller ones apart from the larger), instead of at
    /// every interval the trace has requests in. Those tables are most of the first pass (up to
    /// twenty per interval), and one split elsewhere rounds the request as a single value of the
    /// grid does, only the other requests differently.
    pub fn for_request(snapshot: &TorchSnapshot, options: &ReplayOptions, baseline: &Candidate, size: u64) -> Self {
        let mut space = SearchSpace::of(snapshot, options);
        // The split is written at an interval that has requests: the last one below the
        // request's (intervals without requests round nothing either way).
        let interval = roundup_interval(size);
        let split = space.intervals.range(..interval).next_back().copied().unwrap_or(interval);
        space.table_splits = Some(BTreeSet::from([split]));
        let singles = space.single_key_choices(baseline);
        CandidateSearch { space, singles }
    }

    /// The first pass: each searched key alone, every value of its grid.
    pub fn first_pass(&self) -> Vec<String> {
        self.singles.iter().map(|c| self.space.settings(c)).collect()
    }

    /// The second pass: combinations of the best values of each key, ranked by `objective`
    /// over `results`, what each setting of [`CandidateSearch::first_pass`] measured (in its
    /// order; `None` for those not replayed).
    pub fn second_pass(&self, results: &[Option<Candidate>], objective: Objective) -> Vec<String> {
        let combinations = self.space.combinations(&self.singles, results, objective);
        combinations.iter().map(|c| self.space.settings(c)).collect()
    }
}

/// The dimensions of the search, in the order their keys are written.
const DIMENSIONS: usize = 4;
const EXPANDABLE: usize = 0;
const MAX_SPLIT: usize = 1;
const ROUNDUP: usize = 2;
/// `per_process_memory_fraction` and `garbage_collection_threshold`, which acts only with it.
const FRACTION: usize = 3;

/// One value of a dimension: its `key:value` entries (empty: the key unset).
type Value = Vec<String>;

/// A candidate before it is written out: one value per dimension.
type Choice = [Value; DIMENSIONS];

/// What the trace says about which values can matter.
#[derive(Clone, Debug, PartialEq)]
struct SearchSpace {
    /// Entries of the trace's settings whose keys are not searched, kept in every candidate.
    kept: Vec<String>,
    /// The smallest `max_split_size_mb` the settings allow (`large_segment_size_mb`).
    min_max_split_mb: u64,
    /// The largest segment any request of the trace can need (see the module doc).
    largest_segment: u64,
    /// The `roundup_power2_divisions` intervals the trace has requests in.
    intervals: BTreeSet<usize>,
    /// The device replayed on.
    device_total: u64,
    /// Whether the job sets its own memory fraction (which overrides a configured one).
    own_fraction: bool,
    /// The intervals a two-part roundup table may be split at, where not every interval with
    /// requests ([`CandidateSearch::for_request`]).
    table_splits: Option<BTreeSet<usize>>,
}

impl SearchSpace {
    fn of(snapshot: &TorchSnapshot, options: &ReplayOptions) -> Self {
        let requests: Vec<u64> = snapshot
            .device_traces
            .get(options.device)
            .map(|trace| {
                trace
                    .iter()
                    .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom))
                    .map(|e| e.size)
                    .collect()
            })
            .unwrap_or_default();
        // PyTorch refuses requests from MAX_REQUEST on at once, so no segment is larger.
        let largest = requests.iter().copied().max().unwrap_or(0).clamp(1, MAX_REQUEST);
        let large_segment = options.config.large_segment_size();
        SearchSpace {
            kept: unsearched_entries(options.config.settings()),
            min_max_split_mb: large_segment / MIB,
            largest_segment: allocation_size(largest.next_power_of_two(), large_segment),
            intervals: requests.iter().map(|&size| roundup_interval(size)).collect(),
            device_total: options.device_total,
            own_fraction: options.memory_fraction.is_some(),
            table_splits: None,
        }
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` of `choice`.
    fn settings(&self, choice: &Choice) -> String {
        self.kept.iter().chain(choice.iter().flatten()).cloned().collect::<Vec<_>>().join(",")
    }

    /// Every value of each dimension alone (first pass).
    fn single_key_choices(&self, baseline: &Candidate) -> Vec<Choice> {
        let mut choices = Vec::new();
        for (dimension, values) in self.values(baseline).into_iter().enumerate() {
            for value in values {
                let mut choice = Choice::default();
                choice[dimension] = value;
                choices.push(choice);
            }
        }
        choices
    }

    /// The values tried for each dimension, the key unset not among them.
    fn values(&self, baseline: &Candidate) -> [Vec<Value>; DIMENSIONS] {
        let mut values: [Vec<Value>; DIMENSIONS] = Default::default();
        values[EXPANDABLE] = vec![vec!["expandable_segments:True".to_owned()]];
        values[MAX_SPLIT] = MAX_SPLIT_GRID_MB
            .iter()
            .filter(|&&mb| mb >= self.min_max_split_mb && mb * MIB <= self.largest_segment)
            .map(|mb| vec![format!("max_split_size_mb:{mb}")])
            .collect();
        values[ROUNDUP] = self.roundup_values();
        values[FRACTION] = self.fraction_values(baseline);
        values
    }

    /// Single division counts and two-part tables (one count up to an interval the trace has
    /// requests in, another above it), each distinct on the trace's requests.
    fn roundup_values(&self) -> Vec<Value> {
        let mut seen = BTreeSet::from([self.effective_divisions(&[0; ROUNDUP_INTERVALS])]);
        let mut values = Vec::new();
        let mut add = |text: String, table: [u64; ROUNDUP_INTERVALS]| {
            if seen.insert(self.effective_divisions(&table)) {
                values.push(vec![format!("roundup_power2_divisions:{text}")]);
            }
        };
        for d in SINGLE_DIVISIONS {
            add(d.to_string(), [d; ROUNDUP_INTERVALS]);
        }
        // A split after the last interval with requests would leave nothing above it.
        let last = self.intervals.last().copied().unwrap_or(0);
        let allowed = |split: &usize| self.table_splits.as_ref().is_none_or(|splits| splits.contains(split));
        for &split in self.intervals.iter().filter(|&&i| i < last).filter(|i| allowed(i)) {
            for below in TABLE_DIVISIONS {
                for above in TABLE_DIVISIONS.into_iter().filter(|&a| a != below) {
                    let mut table = [above; ROUNDUP_INTERVALS];
                    table[..=split].fill(below);
                    add(format!("[{}:{below},>:{above}]", 1u64 << split), table);
                }
            }
        }
        values
    }

    /// The divisions of the intervals the trace has requests in, 0 and 1 both as 1.
    fn effective_divisions(&self, table: &[u64; ROUNDUP_INTERVALS]) -> Vec<u64> {
        self.intervals.iter().map(|&i| table[i].max(1)).collect()
    }

    /// Fractions between the baseline's peak allocated and peak reserved, each alone and with
    /// every collection threshold; only thresholds when the job sets its own fraction.
    fn fraction_values(&self, baseline: &Candidate) -> Vec<Value> {
        if self.own_fraction {
            return GC_THRESHOLDS.iter().map(|t| vec![format!("garbage_collection_threshold:{t}")]).collect();
        }
        let (allocated, reserved) = (baseline.peak_allocated as f64, baseline.peak_reserved as f64);
        let total = self.device_total as f64;
        let mut values = Vec::new();
        for step in FRACTION_STEPS {
            let Some(text) = fraction_text((allocated + (reserved - allocated) * step) / total) else { continue };
            let binds = text.parse::<f64>().is_ok_and(|f| f * total < reserved);
            let fraction = format!("per_process_memory_fraction:{text}");
            if !binds || values.iter().any(|v: &Value| v.last() == Some(&fraction)) {
                continue;
            }
            values.push(vec![fraction.clone()]);
            for threshold in GC_THRESHOLDS {
                values.push(vec![format!("garbage_collection_threshold:{threshold}"), fraction.clone()]);
            }
        }
        values
    }

    /// The combinations of at least two dimensions of the best [`BEST_PER_KEY`] values of each
    /// in the first pass (`results[i]` measured `singles[i]`).
    fn combinations(&self, singles: &[Choice], results: &[Option<Candidate>], objective: Objective) -> Vec<Choice> {
        let mut best: [Vec<Value>; DIMENSIONS] = Default::default();
        for (dimension, values) in best.iter_mut().enumerate() {
            let mut measured: Vec<(&Choice, &Candidate)> = singles
                .iter()
                .zip(results)
                .filter(|(choice, _)| !choice[dimension].is_empty())
                .filter_map(|(choice, result)| result.as_ref().map(|r| (choice, r)))
                .collect();
            measured.sort_by_key(|(_, c)| c.rank_key(objective));
            let mut outcomes = BTreeSet::new();
            values.push(Value::new());
            for (choice, candidate) in measured {
                let outcome = (candidate.peak_reserved, candidate.ooms, candidate.device_calls(), candidate.new_ooms);
                if values.len() <= BEST_PER_KEY && outcomes.insert(outcome) {
                    values.push(choice[dimension].clone());
                }
            }
        }
        let mut choices = vec![Choice::default()];
        for (dimension, values) in best.iter().enumerate() {
            choices = choices
                .into_iter()
                .flat_map(|choice| {
                    values.iter().map(move |value| {
                        let mut next = choice.clone();
                        next[dimension] = value.clone();
                        next
                    })
                })
                .collect();
        }
        choices.retain(|choice| choice.iter().filter(|v| !v.is_empty()).count() >= 2);
        choices
    }
}

/// The `roundup_power2_divisions` interval of a request: `[2^(20+i), 2^(21+i))`, the first also
/// covering everything smaller.
fn roundup_interval(size: u64) -> usize {
    let log = 63 - size.max(1).leading_zeros() as usize;
    log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1)
}

/// `fraction` written with four significant digits, if it is a fraction a setting may have.
fn fraction_text(fraction: f64) -> Option<String> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return None;
    }
    let decimals = (3 - fraction.log10().floor() as i32).max(0) as usize;
    let text = format!("{fraction:.decimals$}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    (text.parse::<f64>().is_ok_and(|f| f > 0.0 && f < 1.0)).then(|| text.to_owned())
}

/// The `key:value` entries of `settings` whose keys the search does not set, as written.
fn unsearched_entries(settings: &str) -> Vec<String> {
    all_entries(settings).into_iter().filter(|entry| !SEARCHED_KEYS.contains(&entry_key(entry))).collect()
}

/// `base` with the entries of `changes` in place of those of the same keys, and those of keys
/// `base` does not set added: a candidate of the search made a change to a job's own settings
/// (the search's candidates set only the keys they vary beside the unsearched ones).
pub fn with_entries(base: &str, changes: &str) -> String {
    let changes = all_entries(changes);
    let changed = |entry: &String| changes.iter().any(|c| entry_key(c) == entry_key(entry));
    let mut entries: Vec<String> = all_entries(base).into_iter().filter(|e| !changed(e)).collect();
    entries.extend(changes);
    entries.join(",")
}

/// How many keys have different values (or are set in one only) in settings `a` and `b`.
pub fn keys_changed(a: &str, b: &str) -> usize {
    let (a, b) = (all_entries(a), all_entries(b));
    let value = |entries: &[String], key: &str| {
        entries.iter().find(|e| entry_key(e) == key).map(|e| e.split_once(':').map_or("", |(_, v)| v.trim()).to_owned())
    };
    let keys: BTreeSet<&str> = a.iter().chain(&b).map(|e| entry_key(e)).collect();
    keys.into_iter().filter(|key| value(&a, key) != value(&b, key)).count()
}

/// The `key:value` entries of `settings`, as written (top-level commas separate entries; a
/// `[...]` list keeps its own).
fn all_entries(settings: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, ch) in settings.char_indices().chain([(settings.len(), ',')]) {
        match ch {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                let entry = settings[start..i].trim();
                if !entry.is_empty() {
                    entries.push(entry.to_owned());
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;

    fn space() -> SearchSpace {
        SearchSpace {
            kept: Vec::new(),
            min_max_split_mb: 20,
            // A trace whose largest request is 100 MiB: 128 MiB after the coarsest rounding.
            largest_segment: allocation_size(128 * MIB, 20 * MIB),
            intervals: BTreeSet::from([0, 2, 6]),
            device_total: 80 << 30,
            own_fraction: false,
            table_splits: None,
        }
    }

    /// For one request, tables split only below its interval: the rest of the first pass is
    /// tune's.
    #[test]
    fn a_requests_tables_split_next_to_it() {
        let all = space().roundup_values();
        let near = SearchSpace { table_splits: Some(BTreeSet::from([2])), ..space() }.roundup_values();
        let tables = |values: &[Value]| -> BTreeSet<String> {
            values.iter().flatten().filter(|v| v.contains('[')).cloned().collect()
        };
        assert!(tables(&near).iter().all(|t| t.contains(":[4:")), "{near:?}");
        assert!(!tables(&near).is_empty() && tables(&near).is_subset(&tables(&all)));
        assert!(tables(&all).iter().any(|t| t.contains(":[1:")));
        let singles = |values: &[Value]| values.iter().filter(|v| !v[0].contains('[')).count();
        assert_eq!(singles(&near), singles(&all));
    }

    fn measured(settings: &str, peak_reserved: u64, new_ooms: usize) -> Candidate {
        Candidate {
            settings: settings.to_owned(),
            peak_reserved,
            peak_allocated: 1 << 30,
            ooms: new_ooms,
            new_ooms,
            first_oom: (new_ooms > 0).then(|| ReplayOom {
                index: 7,
                message: "CUDA out of memory.".into(),
                recorded: false,
            }),
            first_new_oom: (new_ooms > 0).then(|| ReplayOom {
                index: 7,
                message: "CUDA out of memory.".into(),
                recorded: false,
            }),
            device_allocs: 10,
            device_frees: 0,
            allocator_seconds: 0.0,
        }
    }

    fn all_settings(space: &SearchSpace, choices: &[Choice]) -> Vec<String> {
        choices.iter().map(|c| space.settings(c)).collect()
    }

    #[test]
    fn own_policy_keeps_the_other_keys() {
        assert_eq!(own_policy_settings(""), "policy:cachalot");
        assert_eq!(
            own_policy_settings("max_split_size_mb:64,roundup_power2_divisions:[1:2,>:4],policy:pytorch"),
            "max_split_size_mb:64,roundup_power2_divisions:[1:2,>:4],policy:cachalot"
        );
        assert!(AllocatorConfig::parse(&own_policy_settings("garbage_collection_threshold:0.6")).is_ok());
    }

    #[test]
    fn a_candidate_changes_the_jobs_own_settings() {
        let own = "max_split_size_mb:200,expandable_segments:True,roundup_power2_divisions:[1:2,>:4]";
        assert_eq!(
            with_entries(own, "pinned_num_register_threads:8,max_split_size_mb:256"),
            "expandable_segments:True,roundup_power2_divisions:[1:2,>:4],pinned_num_register_threads:8,max_split_size_mb:256"
        );
        assert_eq!(keys_changed(own, &with_entries(own, "max_split_size_mb:256")), 1);
        assert_eq!(keys_changed(own, "max_split_size_mb:256"), 3, "one changed, two dropped");
        assert_eq!(keys_changed("", ""), 0);
        assert_eq!(keys_changed("expandable_segments:True", " expandable_segments: True"), 0);
    }

    #[test]
    fn policy_entries_are_split_from_pytorchs_keys() {
        assert_eq!(split_own_keys(""), (String::new(), Vec::new()));
        assert_eq!(
            split_own_keys("max_split_size_mb:64, policy:cachalot,roundup_power2_divisions:[1:2,>:4]"),
            ("max_split_size_mb:64,roundup_power2_divisions:[1:2,>:4]".to_owned(), vec!["policy:cachalot".to_owned()])
        );
        assert_eq!(split_own_keys("policy:pytorch"), (String::new(), vec!["policy:pytorch".to_owned()]));
    }

    #[test]
    fn every_candidate_parses_and_none_repeats() {
        for own_fraction in [false, true] {
            let space = SearchSpace { own_fraction, kept: vec!["pinned_num_register_threads:8".into()], ..space() };
            let baseline = measured("", 3 << 30, 0);
            let singles = space.single_key_choices(&baseline);
            let results: Vec<Option<Candidate>> =
                singles.iter().enumerate().map(|(i, c)| Some(measured(&space.settings(c), i as u64, 0))).collect();
            let mut settings = all_settings(&space, &singles);
            settings.extend(all_settings(&space, &space.combinations(&singles, &results, Objective::PeakReserved)));
            assert!(settings.len() > 50, "{}", settings.len());
            for s in &settings {
                let config = AllocatorConfig::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
                assert_eq!(config.pinned_num_register_threads(), 8, "{s} keeps the unsearched key");
            }
            let unique: BTreeSet<&String> = settings.iter().collect();
            assert_eq!(unique.len(), settings.len(), "duplicates");
        }
    }

    #[test]
    fn pruning_drops_values_that_cannot_matter() {
        let space = space();
        let values = space.values(&measured("", 3 << 30, 0));
        let max_split: Vec<&str> = values[MAX_SPLIT].iter().map(|v| v[0].as_str()).collect();
        assert_eq!(
            max_split,
            [
                "max_split_size_mb:20",
                "max_split_size_mb:32",
                "max_split_size_mb:48",
                "max_split_size_mb:64",
                "max_split_size_mb:96",
                "max_split_size_mb:128"
            ],
            "none above the largest segment (128 MiB)"
        );
        assert_eq!(values[EXPANDABLE], [vec!["expandable_segments:True".to_owned()]], "not the default False");
        // Two-part tables split only after an interval with requests, below the last one.
        let roundup: Vec<&str> = values[ROUNDUP].iter().map(|v| v[0].as_str()).collect();
        assert_eq!(roundup.len(), SINGLE_DIVISIONS.len() + 2 * 20);
        assert!(roundup.contains(&"roundup_power2_divisions:[4:1,>:8]"));
        assert!(!roundup.iter().any(|r| r.contains("[2:") || r.contains("[64:")), "{roundup:?}");
        // Every fraction binds (allowance below the baseline's peak reserved), thresholds only with one.
        for value in &values[FRACTION] {
            let fraction = value.iter().find(|e| e.starts_with("per_process_memory_fraction:")).unwrap();
            let f: f64 = fraction.rsplit(':').next().unwrap().parse().unwrap();
            assert!(
                f * (80u64 << 30) as f64 >= (1u64 << 30) as f64 && f * ((80u64 << 30) as f64) < (3u64 << 30) as f64
            );
        }
        // With the job's own fraction, thresholds alone and no fraction.
        let own = SearchSpace { own_fraction: true, ..space };
        let values = own.values(&measured("", 3 << 30, 0));
        assert_eq!(values[FRACTION].len(), GC_THRESHOLDS.len());
        assert!(values[FRACTION].iter().all(|v| v.len() == 1 && v[0].starts_with("garbage_collection_threshold:")));
    }

    #[test]
    fn equivalent_roundup_tables_are_tried_once() {
        // Requests in one interval only: every table is a single count there.
        let space = SearchSpace { intervals: BTreeSet::from([3]), ..space() };
        let roundup = space.roundup_values();
        assert_eq!(roundup.len(), SINGLE_DIVISIONS.len(), "{roundup:?}");
    }

    #[test]
    fn combinations_take_the_best_values_of_each_key() {
        let space = space();
        let baseline = measured("", 3 << 30, 0);
        let singles = space.single_key_choices(&baseline);
        // Peak falls with the order of the search, but max_split values all OOM.
        let results: Vec<Option<Candidate>> = singles
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let oom = usize::from(!c[MAX_SPLIT].is_empty());
                Some(measured(&space.settings(c), 1000 - i as u64, oom))
            })
            .collect();
        let combinations = space.combinations(&singles, &results, Objective::PeakReserved);
        // (1 + 1) × (1 + 3) × (1 + 3) × (1 + 3) minus the 1 + 1 + 3 + 3 + 3 of fewer than two keys.
        assert_eq!(combinations.len(), 2 * 4 * 4 * 4 - 11);
        // The best roundup values are the last ones tried (the lowest peaks).
        assert!(combinations.iter().all(|c| c.iter().filter(|v| !v.is_empty()).count() >= 2));
        let roundup: BTreeSet<&Value> = combinations.iter().map(|c| &c[ROUNDUP]).collect();
        let all = space.roundup_values();
        assert!(roundup.contains(&all[all.len() - 1]) && !roundup.contains(&all[0]), "{roundup:?}");
    }

    #[test]
    fn an_ooming_candidate_never_ranks_above_one_that_does_not() {
        for objective in Objective::ALL {
            let mut candidates = vec![
                measured("small but fails", 1 << 20, 1),
                measured("large", 10 << 30, 0),
                measured("fails twice", 1 << 10, 2),
                measured("medium", 5 << 30, 0),
            ];
            rank(&mut candidates, objective);
            let order: Vec<&str> = candidates.iter().map(|c| c.settings.as_str()).collect();
            assert!(order[..2].iter().all(|s| !s.contains("fails")), "{objective:?}: {order:?}");
            assert_eq!(order[2..], ["small but fails", "fails twice"], "{objective:?}");
        }
        let mut candidates = vec![measured("large", 10 << 30, 0), measured("medium", 5 << 30, 0)];
        rank(&mut candidates, Objective::PeakReserved);
        assert_eq!(candidates[0].settings, "medium");
    }

    #[test]
    fn recorded_ooms_do_not_count_as_failing() {
        let mut probe = measured("probe", 1 << 30, 0);
        probe.ooms = 2;
        probe.first_oom = Some(ReplayOom { index: 3, message: "CUDA out of memory.".into(), recorded: true });
        assert!(probe.fits());
        let mut candidates = vec![measured("fails", 1 << 20, 1), probe];
        rank(&mut candidates, Objective::PeakReserved);
        assert_eq!(candidates[0].settings, "probe");
    }

    #[test]
    fn fractions_and_entries_are_written_as_settings() {
        assert_eq!(fraction_text(0.0025), Some("0.0025".into()));
        assert_eq!(fraction_text(0.012345678), Some("0.01235".into()));
        assert_eq!(fraction_text(0.5), Some("0.5".into()));
        assert_eq!(fraction_text(1.0), None);
        assert_eq!(fraction_text(0.0), None);
        assert_eq!(
            unsearched_entries(
                "max_split_size_mb:64, pinned_num_register_threads:8,roundup_power2_divisions:[1:4,>:8],backend:native"
            ),
            ["pinned_num_register_threads:8", "backend:native"]
        );
        assert!(unsearched_entries("").is_empty());
        assert_eq!(roundup_interval(1000), 0);
        assert_eq!(roundup_interval(3 << 20), 1);
        assert_eq!(roundup_interval(1 << 50), ROUNDUP_INTERVALS - 1);
    }
}
