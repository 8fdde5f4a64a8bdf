//! #33: samples, pass@k and best-of-N. A template with `count = n` (n ≥ 2) makes `n` samples of
//! each item, grouped under the item's name (`TaskSpec::sample_of`, set by the batch loader).
//! Everything here is a pure reading of the run's state:
//!
//! - a sample **passed** when it finished `completed` (a task with a check completes only when
//!   its last verdict passed); its **score** is its last verdict's score, else 1 for completed
//!   and 0 otherwise;
//! - an item's `n` counts its **judged** samples: finished, neither cancelled nor skipped (a
//!   sample `pick = "first-pass"` cancelled, or a user cancelled, says nothing of the agent);
//!   `c` those that passed; pass@k for k = 1..n with the unbiased estimator
//!   1 - C(n-c, k) / C(n, k), computed as a product ([`pass_at_k`]);
//! - the **winner** under `pick`: `first-pass`, the passed sample whose last attempt ended
//!   first (a tie: the earliest in batch order); `best-score`, once every sample finished, the
//!   passed sample with the highest score (a tie: the earliest). A sample that did not pass
//!   never wins;
//! - per model and per role, the pass rate of the judged tasks with a 95% Wilson score
//!   interval ([`wilson`]).
//!
//! The planner asks [`first_pass_loser`] which unfinished samples lose to a winner.

use std::collections::BTreeMap;

use crate::ids::{TaskId, Timestamp};
use crate::outcome::TerminalState;
use crate::spec::TaskSpec;
use crate::state::{AttemptEnd, RunState, TaskRecord};
use crate::verify::{Pick, SCORE_UNIT};

/// The z of a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// One item's samples, as they stand.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The item's name (`fix-a-*`).
    pub name: String,
    /// The template's `pick`.
    pub pick: Option<Pick>,
    /// Its samples, in batch order.
    pub samples: Vec<TaskId>,
    /// Its judged samples (finished, neither cancelled nor skipped).
    pub n: u32,
    /// Its judged samples that passed.
    pub c: u32,
    /// pass@k for k = 1..=n (empty while none is judged).
    pub pass_at: Vec<f64>,
    /// The mean score of its judged samples, from 0 to 1 (None while none is judged).
    pub mean_score: Option<f64>,
    /// Its winner under `pick`, once there is one.
    pub winner: Option<TaskId>,
    /// Its samples that finished (in any state).
    pub finished: u32,
}

/// A pass rate over some tasks, with its 95% Wilson interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    /// The model or the role.
    pub name: String,
    /// Judged tasks.
    pub n: u32,
    /// Of which passed.
    pub c: u32,
    /// c / n.
    pub rate: f64,
    /// The interval's lower end.
    pub low: f64,
    /// The interval's upper end.
    pub high: f64,
}

/// Pass rates per model and per role.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rates {
    /// Per model (the model of a task's last attempt, else its spec's, else `<agent> default`).
    pub by_model: Vec<Rate>,
    /// Per role (tasks with a role only).
    pub by_role: Vec<Rate>,
}

/// Whether a finished task passed (None: not finished).
pub fn passed(rec: &TaskRecord) -> Option<bool> {
    let result = rec.result()?;
    let verdict_ok = crate::verify::verdicts(rec).last().is_none_or(|v| v.passed);
    Some(result.state == TerminalState::Completed && verdict_ok)
}

/// Whether a finished task counts as judged: neither cancelled nor skipped.
pub fn judged(rec: &TaskRecord) -> bool {
    rec.result()
        .is_some_and(|r| !matches!(r.state, TerminalState::Cancelled | TerminalState::Skipped))
}

/// A finished task's score in millionths: its last verdict's, else all or nothing.
pub fn score(rec: &TaskRecord) -> Option<u32> {
    let ok = passed(rec)?;
    Some(match crate::verify::verdicts(rec).last() {
        Some(v) => v.score,
        None if ok => SCORE_UNIT,
        None => 0,
    })
}

/// pass@k of `n` samples of which `c` passed: 1 - C(n-c, k) / C(n, k), as the product
/// 1 - Π_{i=n-c+1..=n} (1 - k/i), which neither overflows nor loses precision. 0 for k = 0 or
/// k > n.
pub fn pass_at_k(n: u32, c: u32, k: u32) -> f64 {
    if k == 0 || k > n {
        return 0.0;
    }
    let c = c.min(n);
    if n - c < k {
        return 1.0;
    }
    let k = f64::from(k);
    let fail: f64 = (n - c + 1..=n).map(|i| 1.0 - k / f64::from(i)).product();
    1.0 - fail
}

/// The 95% Wilson score interval of `c` successes in `n` trials ((0, 1) for none).
pub fn wilson(c: u32, n: u32) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = f64::from(n);
    let p = f64::from(c.min(n as u32)) / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((center - half).max(0.0), (center + half).min(1.0))
}

/// A rate of `c` in `n`, named.
pub fn rate(name: &str, c: u32, n: u32) -> Rate {
    let (low, high) = wilson(c, n);
    Rate {
        name: name.to_owned(),
        n,
        c,
        rate: if n == 0 {
            0.0
        } else {
            f64::from(c) / f64::from(n)
        },
        low,
        high,
    }
}

/// The items of the run, in batch order (an item comes where its first sample is). Empty for a
/// run without samples.
pub fn items(state: &RunState) -> Vec<Item> {
    let Some(batch) = &state.batch else {
        return Vec::new();
    };
    let mut order: Vec<Item> = Vec::new();
    let mut at: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, spec) in batch.tasks.iter().enumerate() {
        let Some(name) = spec.sample_of.as_deref() else {
            continue;
        };
        let slot = *at.entry(name).or_insert_with(|| {
            order.push(Item {
                name: name.to_owned(),
                pick: spec.pick,
                samples: Vec::new(),
                n: 0,
                c: 0,
                pass_at: Vec::new(),
                mean_score: None,
                winner: None,
                finished: 0,
            });
            order.len() - 1
        });
        order[slot].samples.push(TaskId(i as u32));
    }
    for item in &mut order {
        fill(state, item);
    }
    order
}

/// Counts an item's samples and finds its winner.
fn fill(state: &RunState, item: &mut Item) {
    let mut total_score = 0u64;
    for &t in &item.samples {
        let Some(rec) = state.task(t) else { continue };
        if rec.result().is_some() {
            item.finished += 1;
        }
        if !judged(rec) {
            continue;
        }
        item.n += 1;
        item.c += u32::from(passed(rec) == Some(true));
        total_score += u64::from(score(rec).unwrap_or(0));
    }
    item.pass_at = (1..=item.n).map(|k| pass_at_k(item.n, item.c, k)).collect();
    item.mean_score =
        (item.n > 0).then(|| total_score as f64 / f64::from(item.n) / f64::from(SCORE_UNIT));
    item.winner = item.pick.and_then(|p| winner(state, p, &item.samples));
}

/// The winner among `samples` (batch order) under `pick`, once there is one.
pub fn winner(state: &RunState, pick: Pick, samples: &[TaskId]) -> Option<TaskId> {
    let passed: Vec<(TaskId, &TaskRecord)> = samples
        .iter()
        .filter_map(|&t| state.task(t).map(|r| (t, r)))
        .filter(|(_, r)| passed(r) == Some(true))
        .collect();
    match pick {
        // min_by_key keeps the first of equal keys: the earliest in batch order.
        Pick::FirstPass => passed
            .iter()
            .min_by_key(|(_, r)| ended_at(r))
            .map(|(t, _)| *t),
        Pick::BestScore => {
            let all_finished = samples
                .iter()
                .all(|&t| state.task(t).is_some_and(|r| r.result().is_some()));
            if !all_finished {
                return None;
            }
            let mut best: Option<(TaskId, u32)> = None;
            for (t, r) in passed {
                let s = score(r).unwrap_or(0);
                if best.is_none_or(|(_, b)| s > b) {
                    best = Some((t, s));
                }
            }
            best.map(|(t, _)| t)
        }
    }
}

/// When a task's last attempt ended (a task that ran none: the start of time).
fn ended_at(rec: &TaskRecord) -> Timestamp {
    match rec.attempts.last().and_then(|a| a.end.as_ref()) {
        Some(AttemptEnd::Finished { at, .. } | AttemptEnd::Orphaned { at, .. }) => *at,
        None => Timestamp(0),
    }
}

/// The samples of `item` (a template with `pick = "first-pass"`) that lose now that one of them
/// passed: the unfinished ones, with the error they end with (`cancelled: sample fix-a-2 of
/// fix-a-* passed first`). Empty while none passed.
pub fn first_pass_losers(
    state: &RunState,
    item: &str,
    samples: &[TaskId],
) -> Vec<(TaskId, String)> {
    let Some(win) = winner(state, Pick::FirstPass, samples) else {
        return Vec::new();
    };
    let label = state.spec(win).map_or("?", |s| s.label.as_str());
    samples
        .iter()
        .filter(|&&t| t != win && state.task(t).is_some_and(|r| r.result().is_none()))
        .map(|&t| (t, first_pass_loser(label, item)))
        .collect()
}

/// The error of a sample that lost to `winner` under `pick = "first-pass"`.
pub fn first_pass_loser(winner: &str, item: &str) -> String {
    format!("cancelled: sample {winner} of {item} passed first")
}

/// Whether `task` is a sample of an item whose `pick` chose another sample: what `sortie apply
/// --all` leaves out and whose kept worktree is discarded after the run. An item whose pick
/// chose none (no sample passed) loses none: its worktrees stay for a look.
pub fn lost(state: &RunState, items: &[Item], task: TaskId) -> bool {
    let Some(name) = state.spec(task).and_then(|s| s.sample_of.as_deref()) else {
        return false;
    };
    items
        .iter()
        .find(|i| i.name == name)
        .is_some_and(|i| i.pick.is_some() && i.winner.is_some_and(|w| w != task))
}

/// The model a task is counted under.
fn model_of(spec: &TaskSpec, rec: &TaskRecord) -> String {
    rec.attempts
        .last()
        .and_then(|a| a.model())
        .or(spec.model.as_deref())
        .map_or_else(|| format!("{} default", spec.agent), str::to_owned)
}

/// Pass rates per model and per role over the judged tasks (names sorted).
pub fn rates(state: &RunState) -> Rates {
    let Some(batch) = &state.batch else {
        return Rates::default();
    };
    let mut models: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut roles: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for (spec, rec) in batch.tasks.iter().zip(&state.tasks) {
        if !judged(rec) {
            continue;
        }
        let ok = u32::from(passed(rec) == Some(true));
        let m = models.entry(model_of(spec, rec)).or_default();
        m.0 += ok;
        m.1 += 1;
        if let Some(role) = &spec.role {
            let r = roles.entry(role.clone()).or_default();
            r.0 += ok;
            r.1 += 1;
        }
    }
    let list = |m: BTreeMap<String, (u32, u32)>| {
        m.into_iter()
            .map(|(name, (c, n))| rate(&name, c, n))
            .collect()
    };
    Rates {
        by_model: list(models),
        by_role: list(roles),
    }
}

/// One line per item for the end-of-run summary: `fix-a-*: 3 of 5 passed, pass@1 0.60, winner
/// fix-a-2`.
pub fn summary_lines(state: &RunState) -> Vec<String> {
    items(state)
        .iter()
        .map(|item| {
            let mut line = format!("{}: {} of {} passed", item.name, item.c, item.n);
            if let Some(p1) = item.pass_at.first() {
                line.push_str(&format!(", pass@1 {p1:.2}"));
            }
            if let Some(w) = item.winner.and_then(|w| state.spec(w)) {
                line.push_str(&format!(", winner {}", w.label));
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// C(n, k) exactly, as a float (n ≤ 60).
    fn choose(n: u32, k: u32) -> f64 {
        if k > n {
            return 0.0;
        }
        let mut r: u128 = 1;
        for i in 0..k {
            r = r * u128::from(n - i) / u128::from(i + 1);
        }
        r as f64
    }

    #[test]
    fn pass_at_k_on_known_values() {
        assert_eq!(pass_at_k(5, 0, 1), 0.0);
        assert_eq!(pass_at_k(5, 5, 1), 1.0);
        assert!((pass_at_k(5, 2, 1) - 0.4).abs() < 1e-12);
        // 1 - C(3,2)/C(5,2) = 1 - 3/10
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        assert_eq!(pass_at_k(5, 2, 4), 1.0);
        assert_eq!(pass_at_k(5, 2, 0), 0.0);
        assert_eq!(pass_at_k(5, 2, 6), 0.0);
        // Large n stays finite and in range.
        let p = pass_at_k(10_000, 3, 100);
        assert!(p > 0.0 && p < 1.0);
    }

    #[test]
    fn wilson_on_known_values() {
        let (lo, hi) = wilson(5, 10);
        assert!((lo - 0.2366).abs() < 1e-3 && (hi - 0.7634).abs() < 1e-3);
        let (lo, hi) = wilson(0, 10);
        assert!(lo == 0.0 && (hi - 0.2775).abs() < 1e-3);
        let (lo, hi) = wilson(10, 10);
        assert!((lo - 0.7225).abs() < 1e-3 && (hi - 1.0).abs() < 1e-9);
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    proptest! {
        #[test]
        fn pass_at_k_equals_the_combinatorial_formula(n in 1u32..40, c_frac in 0u32..=100, k_frac in 0u32..=100) {
            let c = c_frac * n / 100;
            let k = 1 + k_frac * (n - 1) / 100;
            let direct = 1.0 - choose(n - c, k) / choose(n, k);
            prop_assert!((pass_at_k(n, c, k) - direct).abs() < 1e-9);
            prop_assert!((pass_at_k(n, c, 1) - f64::from(c) / f64::from(n)).abs() < 1e-12);
            prop_assert_eq!(pass_at_k(n, c, n), if c > 0 { 1.0 } else { 0.0 });
            // pass@k grows with k.
            prop_assert!(pass_at_k(n, c, k) <= pass_at_k(n, c, n) + 1e-12);
        }

        #[test]
        fn the_wilson_interval_holds_the_rate(n in 1u32..1000, c_frac in 0u32..=100) {
            let c = c_frac * n / 100;
            let (lo, hi) = wilson(c, n);
            let p = f64::from(c) / f64::from(n);
            prop_assert!(0.0 <= lo && lo <= p + 1e-12 && p <= hi + 1e-12 && hi <= 1.0);
        }
    }
}
