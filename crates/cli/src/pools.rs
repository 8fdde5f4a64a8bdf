//! The pools of a run (issue 14) as `status` shows them: each pool's limit, its attempts in
//! flight, how long it backs off, its rate limits; and the tasks it holds back.

use std::io::Write;

use serde::Serialize;
use sortie_core::{RunState, Timestamp};

use crate::error::Result;

/// One pool, as `status` and `status --json` show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PoolView {
    /// Its name (a `[pools.NAME]` table, or a provider).
    pub(crate) name: String,
    /// Whether it adapts to rate limits.
    pub(crate) adaptive: bool,
    /// Its limit now.
    pub(crate) limit: u32,
    /// Its maximum (its `concurrency`, else the run's).
    pub(crate) max: u32,
    /// Its attempts in flight.
    pub(crate) in_flight: u32,
    /// It launches nothing before this time (ms since the epoch), when backing off now.
    pub(crate) backing_off_until: Option<u64>,
    /// Its attempts that ended rate limited.
    pub(crate) rate_limited: u64,
    /// Its attempts that ended otherwise.
    pub(crate) succeeded: u64,
    /// The tasks ready to launch that it holds back now.
    pub(crate) waiting: usize,
}

/// The pools of `state` at `now` (ms since the epoch), by name.
pub(crate) fn views(state: &RunState, now: u64) -> Vec<PoolView> {
    let Some(batch) = &state.batch else {
        return Vec::new();
    };
    let run = state
        .control
        .concurrency
        .unwrap_or(batch.config.concurrency);
    let now = Timestamp(now);
    let mut waiting: std::collections::BTreeMap<&str, usize> = Default::default();
    if state.pools.values().any(|p| p.holds(now, run, 0)) {
        for i in 0..state.tasks.len() {
            if let Some(p) =
                sortie_core::waiting_for_pool(state, sortie_core::TaskId(i as u32), now)
            {
                *waiting.entry(p).or_insert(0) += 1;
            }
        }
    }
    state
        .pools
        .iter()
        .map(|(name, p)| PoolView {
            name: name.clone(),
            adaptive: p.adaptive,
            limit: p.limit(run),
            max: p.max(run),
            in_flight: p.in_flight,
            backing_off_until: p.backoff_until.filter(|t| *t > now).map(|t| t.0),
            rate_limited: p.rate_limited,
            succeeded: p.succeeded,
            waiting: waiting.get(name.as_str()).copied().unwrap_or(0),
        })
        .collect()
}

/// `pools:` and one line per pool, when the run has any.
pub(crate) fn print(out: &mut impl Write, pools: &[PoolView], now: u64) -> Result<()> {
    if pools.is_empty() {
        return Ok(());
    }
    writeln!(out, "pools:")?;
    for p in pools {
        let mut parts = vec![format!(
            "limit {} of {}{}",
            p.limit,
            p.max,
            if p.adaptive { "" } else { " (fixed)" }
        )];
        parts.push(format!("{} in flight", p.in_flight));
        if let Some(until) = p.backing_off_until {
            parts.push(format!(
                "backing off for {}",
                crate::board::short_duration(until.saturating_sub(now))
            ));
        }
        if p.waiting > 0 {
            parts.push(format!("{} waiting", p.waiting));
        }
        parts.push(format!(
            "{} rate limited, {} ended otherwise",
            p.rate_limited, p.succeeded
        ));
        writeln!(out, "  {:<16} {}", p.name, parts.join(", "))?;
    }
    Ok(())
}
