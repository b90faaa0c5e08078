//! Why one run's marks differ from the baseline's, tested rather than guessed: the experiment is
//! rerun on the simulator, without computing, with the baseline's [`Factors`], then with the
//! other run's factors switched in one at a time. A factor that moves the simulated marks is a
//! reason, with the marks and bytes it accounts for.

use std::collections::BTreeMap;
use std::future::Future;

use cachalot_core::AllocatorConfig;
use cachalot_core::TraceEntry;
use cachalot_core::error::group_digits as group;

use super::columns::{Column, Factors, MarkValue};
use crate::device::Workspaces;
use crate::device::sim::{SimDevice, SimProfile};
use crate::error::RuntimeError;
use crate::experiments::Experiment;
use crate::runtime::Runtime;

/// What the simulator did with an experiment.
#[derive(Clone, Debug)]
pub struct Simulated {
    /// The marks.
    pub marks: Vec<MarkValue>,
    /// The allocator's trace.
    pub trace: Vec<TraceEntry>,
    /// The error that stopped the run, if any.
    pub error: Option<String>,
}

/// Runs `experiment` on the simulator, without computing, with `factors`.
pub fn simulate(experiment: &Experiment, factors: &Factors) -> Result<Simulated, RuntimeError> {
    let profile = SimProfile {
        name: "what-if".into(),
        discipline: factors.discipline,
        workspaces: factors.workspaces,
        capacity: factors.capacity,
        max_segment_size: factors.max_segment_size,
    };
    let config = AllocatorConfig::parse(&factors.settings).map_err(|e| RuntimeError::Parameters(e.to_string()))?;
    let rt = Runtime::new(Box::new(SimDevice::new(profile, config, false)?));
    let error = experiment.run(&rt).err().map(|e| e.to_string());
    let marks =
        rt.marks().into_iter().map(|m| MarkValue { label: m.label, allocated: m.allocated, reserved: m.reserved });
    Ok(Simulated { marks: marks.collect(), trace: rt.trace(), error })
}

/// One of the [`Factors`], in the order they are tested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorKind {
    /// The matrix products' persistent cuBLAS/cuBLASLt workspaces.
    Workspaces,
    /// The allocator settings (`PYTORCH_CUDA_ALLOC_CONF`).
    Settings,
    /// When freed blocks become reusable.
    StreamDiscipline,
    /// Device memory.
    DeviceMemory,
    /// Largest segment the device allows.
    MaxSegmentSize,
}

impl FactorKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            FactorKind::Workspaces => "cuBLAS/cuBLASLt workspaces",
            FactorKind::Settings => "allocator settings",
            FactorKind::StreamDiscipline => "stream discipline",
            FactorKind::DeviceMemory => "device memory",
            FactorKind::MaxSegmentSize => "largest segment (max_buffer_size)",
        }
    }

    /// Switches this factor of `factors` to the value it has in `to`.
    fn switch(self, factors: &mut Factors, to: &Factors) {
        match self {
            FactorKind::Workspaces => factors.workspaces = to.workspaces,
            FactorKind::Settings => factors.settings.clone_from(&to.settings),
            FactorKind::StreamDiscipline => factors.discipline = to.discipline,
            FactorKind::DeviceMemory => factors.capacity = to.capacity,
            FactorKind::MaxSegmentSize => factors.max_segment_size = to.max_segment_size,
        }
    }
}

/// A factor that differs between two runs, and why it matters.
#[derive(Clone, Debug, PartialEq)]
pub struct FactorDifference {
    /// Which factor.
    pub kind: FactorKind,
    /// Both runs' values and what they do, in a sentence.
    pub description: String,
}

/// The change of `memory_allocated()` / `memory_reserved()` over a run of consecutive marks
/// that all changed by the same bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkShift {
    /// The marks, in order.
    pub labels: Vec<String>,
    /// Bytes allocated after minus before.
    pub allocated: i128,
    /// Bytes reserved after minus before.
    pub reserved: i128,
}

/// One factor switched in on the simulator, and what it did to the marks.
#[derive(Clone, Debug, PartialEq)]
pub struct TestedFactor {
    /// The factor.
    pub factor: FactorDifference,
    /// How the marks moved when it was switched in.
    pub shifts: Vec<MarkShift>,
    /// Labels whose values differ before and after, with labels only one side has.
    pub changed: Vec<String>,
    /// The error that stopped the simulated run with this factor switched in.
    pub simulation_error: Option<String>,
}

impl TestedFactor {
    /// Whether switching it moved the marks: then it is a reason, confirmed by the simulator.
    pub fn is_reason(&self) -> bool {
        !self.shifts.is_empty() || !self.changed.is_empty()
    }
}

/// The simulator's test of every differing factor, which ran to the end.
#[derive(Clone, Debug, PartialEq)]
pub struct FactorTest {
    /// The experiment rerun.
    pub experiment: String,
    /// The factors in the order they were switched in.
    pub factors: Vec<TestedFactor>,
    /// Labels where the simulator with every factor switched still differs from the other run;
    /// empty when every difference is explained.
    pub unexplained: Vec<String>,
    /// How the other run's marks differ from that last simulation.
    pub remaining: Vec<MarkShift>,
    /// Of [`unexplained`](Self::unexplained), the labels the other run lacks.
    pub only_one_has: Vec<String>,
}

/// Why the simulator could not test the factors.
#[derive(Clone, Debug, PartialEq)]
pub enum FailedRerun {
    /// The baseline's experiment could not run on the simulator.
    Baseline {
        /// The experiment.
        experiment: String,
        /// Why.
        error: String,
    },
    /// The simulator with the baseline's factors gives other marks than the baseline.
    BaselineNotReproduced {
        /// Labels where they differ.
        marks: Vec<String>,
    },
    /// A factor could not be switched in.
    Factor {
        /// The factors tested before it.
        tested: Vec<TestedFactor>,
        /// The factor.
        kind: FactorKind,
        /// Why.
        error: String,
    },
}

/// Why the other run's marks differ from the baseline's, as far as it is known.
#[derive(Clone, Debug, PartialEq)]
pub enum Explanation {
    /// The runs ran different experiments or parameters: their marks measure different
    /// programs, so no difference is counted as unexplained.
    DifferentExperiments {
        /// The baseline's experiment.
        base: String,
        /// The other run's experiment.
        other: String,
    },
    /// The factors were tested on the simulator.
    Tested(FactorTest),
    /// The factors could not be tested (unknown program, verification off, or a failed rerun):
    /// they are possible reasons only.
    Untested {
        /// Why a rerun failed, when one was tried.
        failed_rerun: Option<FailedRerun>,
        /// The factors that differ, each a possible reason.
        factors: Vec<FactorDifference>,
        /// Every differing label.
        unexplained: Vec<String>,
    },
}

impl Explanation {
    /// Labels whose difference no reason accounts for.
    pub fn unexplained(&self) -> &[String] {
        match self {
            Explanation::DifferentExperiments { .. } => &[],
            Explanation::Tested(test) => &test.unexplained,
            Explanation::Untested { unexplained, .. } => unexplained,
        }
    }
}

/// The factors that differ between two runs, in test order.
pub(super) fn differing_factors(a: &Column, b: &Column) -> Vec<FactorDifference> {
    let (fa, fb) = (&a.factors, &b.factors);
    let mut out = Vec::new();
    let mut differs = |kind, description| out.push(FactorDifference { kind, description });
    if fa.workspaces != fb.workspaces {
        let describe = |ws: Option<Workspaces>, c: &Column| match ws {
            Some(ws) => format!(
                "{} allocates a {} B cuBLAS workspace and a {} B cuBLASLt workspace at its first matrix products, \
                 and keeps them ({})",
                c.name,
                group(ws.cublas),
                group(ws.cublaslt),
                c.workspace_source
            ),
            None => format!("{} allocates no workspace ({})", c.name, c.workspace_source),
        };
        let why = if fa.workspaces.is_none() || fb.workspaces.is_none() {
            "PyTorch's CUDA matmuls keep these persistent workspaces; the WGSL matmul of wgpu needs none"
        } else {
            "PyTorch 2.11 sizes them by compute capability (32 MiB on 9.x, 10.x, 12.x; 8.125 MiB otherwise) \
             and CUBLAS_WORKSPACE_CONFIG"
        };
        differs(
            FactorKind::Workspaces,
            format!("{}; {}. {why}", describe(fa.workspaces, a), describe(fb.workspaces, b)),
        );
    }
    if fa.settings != fb.settings {
        differs(FactorKind::Settings, format!("settings '{}' vs '{}'", fa.settings, fb.settings));
    }
    if fa.discipline != fb.discipline {
        differs(
            FactorKind::StreamDiscipline,
            format!("{}: {}; {}: {}", a.name, fa.discipline.describe(), b.name, fb.discipline.describe()),
        );
    }
    if fa.capacity != fb.capacity {
        differs(FactorKind::DeviceMemory, format!("{} B vs {} B", group(fa.capacity), group(fb.capacity)));
    }
    if fa.max_segment_size != fb.max_segment_size {
        let show = |m: Option<u64>| m.map_or("unlimited".to_owned(), |m| format!("{} B", group(m)));
        differs(FactorKind::MaxSegmentSize, format!("{} vs {}", show(fa.max_segment_size), show(fb.max_segment_size)));
    }
    out
}

/// Labels whose values differ between two mark lists, with labels only one has. A run without
/// any marks (a PyTorch snapshot pickle) has nothing to differ in.
pub(super) fn mark_differences(a: &[MarkValue], b: &[MarkValue]) -> Vec<String> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let bm: BTreeMap<&str, &MarkValue> = b.iter().map(|m| (m.label.as_str(), m)).collect();
    let am: BTreeMap<&str, &MarkValue> = a.iter().map(|m| (m.label.as_str(), m)).collect();
    let mut out: Vec<String> = a
        .iter()
        .filter(|m| bm.get(m.label.as_str()).is_none_or(|o| o.allocated != m.allocated || o.reserved != m.reserved))
        .map(|m| m.label.clone())
        .collect();
    out.extend(b.iter().filter(|m| !am.contains_key(m.label.as_str())).map(|m| m.label.clone()));
    out
}

/// `after − before` per mark both have, grouped over consecutive marks with the same change.
fn mark_shifts(before: &[MarkValue], after: &[MarkValue]) -> Vec<MarkShift> {
    let am: BTreeMap<&str, &MarkValue> = after.iter().map(|m| (m.label.as_str(), m)).collect();
    let mut shifts: Vec<MarkShift> = Vec::new();
    for m in before {
        let Some(o) = am.get(m.label.as_str()) else { continue };
        let (da, dr) = (o.allocated as i128 - m.allocated as i128, o.reserved as i128 - m.reserved as i128);
        if da == 0 && dr == 0 {
            continue;
        }
        match shifts.last_mut() {
            Some(last) if last.allocated == da && last.reserved == dr => last.labels.push(m.label.clone()),
            _ => shifts.push(MarkShift { labels: vec![m.label.clone()], allocated: da, reserved: dr }),
        }
    }
    shifts
}

/// Explains why `other`'s marks differ from `base`'s (see the module docs), awaiting
/// `pause` before each rerun on the simulator.
pub(super) async fn explain<P, F>(base: &Column, other: &Column, verify: bool, pause: &mut P) -> Explanation
where
    P: FnMut(String) -> F,
    F: Future<Output = ()>,
{
    let factors = differing_factors(base, other);
    let experiment = match (&base.experiment, &other.experiment) {
        (Some(a), Some(b)) if a != b => {
            return Explanation::DifferentExperiments { base: a.name().to_owned(), other: b.name().to_owned() };
        }
        (Some(a), Some(_)) => Some(a),
        // A run whose program is unknown (another tool's snapshot) cannot be rerun.
        _ => None,
    };
    let failed_rerun = match experiment.filter(|_| verify) {
        Some(experiment) => match test_factors(experiment, base, other, &factors, pause).await {
            Ok(test) => return Explanation::Tested(test),
            Err(failed) => Some(failed),
        },
        None => None,
    };
    Explanation::Untested { failed_rerun, factors, unexplained: mark_differences(&base.marks, &other.marks) }
}

/// Switches the factors in on the simulator one at a time.
async fn test_factors<P, F>(
    experiment: &Experiment,
    base: &Column,
    other: &Column,
    factors: &[FactorDifference],
    pause: &mut P,
) -> Result<FactorTest, FailedRerun>
where
    P: FnMut(String) -> F,
    F: Future<Output = ()>,
{
    let mut switched = base.factors.clone();
    pause(format!("{} with {}'s factors", experiment.name(), base.name)).await;
    let mut marks = simulate(experiment, &switched)
        .map_err(|e| FailedRerun::Baseline { experiment: experiment.name().to_owned(), error: e.to_string() })?
        .marks;
    let off = mark_differences(&base.marks, &marks);
    if !off.is_empty() {
        return Err(FailedRerun::BaselineNotReproduced { marks: off });
    }
    let mut tested = Vec::with_capacity(factors.len());
    for factor in factors {
        factor.kind.switch(&mut switched, &other.factors);
        pause(format!("{} with {}'s {} switched in", experiment.name(), other.name, factor.kind.name())).await;
        let sim = match simulate(experiment, &switched) {
            Ok(sim) => sim,
            Err(e) => return Err(FailedRerun::Factor { tested, kind: factor.kind, error: e.to_string() }),
        };
        tested.push(TestedFactor {
            factor: factor.clone(),
            shifts: mark_shifts(&marks, &sim.marks),
            changed: mark_differences(&marks, &sim.marks),
            simulation_error: sim.error,
        });
        marks = sim.marks;
    }
    let unexplained = mark_differences(&marks, &other.marks);
    let only_one_has = unexplained.iter().filter(|l| !other.marks.iter().any(|m| &m.label == *l)).cloned().collect();
    Ok(FactorTest {
        experiment: experiment.name().to_owned(),
        factors: tested,
        remaining: mark_shifts(&marks, &other.marks),
        unexplained,
        only_one_has,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(label: &str, allocated: u64, reserved: u64) -> MarkValue {
        MarkValue { label: label.into(), allocated, reserved }
    }

    #[test]
    fn shifts_group_consecutive_marks_with_the_same_change() {
        let before = [mark("a", 0, 0), mark("b", 10, 20), mark("c", 10, 20), mark("d", 5, 5), mark("e", 1, 1)];
        let after = [mark("a", 0, 0), mark("b", 0, 30), mark("c", 0, 30), mark("d", 0, 5), mark("f", 9, 9)];
        let shifts = mark_shifts(&before, &after);
        assert_eq!(
            shifts,
            [
                MarkShift { labels: vec!["b".into(), "c".into()], allocated: -10, reserved: 10 },
                MarkShift { labels: vec!["d".into()], allocated: -5, reserved: 0 },
            ]
        );
        assert_eq!(mark_differences(&before, &after), ["b", "c", "d", "e", "f"]);
    }
}
