//! `sortie audit RUN`: checks the journal record by record (checksum, format, dense seq, legal
//! transitions, ledger recomputed from the raw events) and prints the usage ledger. Exit 0 when
//! the journal is whole, 4 when it is not.

use std::io::Write;

use crate::error::{CliError, Result};
use serde::Serialize;
use sortie_core::ledger::Ledger;

use super::{Code, open_read};
use crate::args::Global;
use crate::output;

#[derive(Serialize)]
struct AuditView<'a> {
    run_id: String,
    events: u64,
    clean: bool,
    first_bad_seq: Option<u64>,
    problem: Option<String>,
    ledger_mismatch: Option<&'a str>,
    ledger: LedgerView,
    snapshot_mismatch: Option<&'a str>,
    /// #32: each rebuild of the journal by `sortie recover`.
    recovered: Vec<String>,
    /// #33: the checks' verdicts the journal holds (each once: the fold refuses a second).
    checks: ChecksView,
    /// #34: the sandboxed attempts' connections the journal holds (`SandboxNet`).
    network: NetView,
}

/// #34: how many sandboxed attempts journaled their connections, and how many of those were
/// allowed and denied (name lookups included).
#[derive(Serialize, Default)]
struct NetView {
    attempts: usize,
    allowed: u64,
    denied: u64,
}

fn net_view(state: &sortie_core::RunState) -> NetView {
    let mut v = NetView::default();
    for flows in state
        .tasks
        .iter()
        .flat_map(|r| &r.attempts)
        .filter_map(|a| a.net())
    {
        v.attempts += 1;
        for f in flows {
            let n = u64::from(f.count);
            if f.allowed {
                v.allowed += n;
            } else {
                v.denied += n;
            }
        }
    }
    v
}

/// #33: how many checks the journal holds a verdict of, and how they went.
#[derive(Serialize, Default)]
struct ChecksView {
    verdicts: usize,
    passed: usize,
    failed: usize,
}

fn checks_view(state: &sortie_core::RunState) -> ChecksView {
    let mut v = ChecksView::default();
    for rec in &state.tasks {
        for verdict in sortie_core::verify::verdicts(rec) {
            v.verdicts += 1;
            if verdict.passed {
                v.passed += 1;
            } else {
                v.failed += 1;
            }
        }
    }
    v
}

#[derive(Serialize)]
struct LedgerView {
    tasks: Vec<(String, sortie_core::Usage)>,
    models: Vec<(Option<String>, sortie_core::Usage)>,
    total: sortie_core::Usage,
    total_cost: String,
}

fn ledger_view(state: &sortie_core::RunState, l: &Ledger) -> LedgerView {
    LedgerView {
        tasks: l.tasks.iter().map(|(t, u)| (state.label(*t), *u)).collect(),
        models: l.models.iter().map(|(m, u)| (m.clone(), *u)).collect(),
        total: l.total,
        total_cost: l.total.cost.to_string(),
    }
}

/// Audits a run.
pub(crate) fn audit(g: &Global, run: &str) -> Result<Code> {
    let run = super::find_run(g, run)?;
    let journal = match open_read(&g.layout(), &run) {
        Err(e) if e.code() == Code::Corrupt => return unreadable(g, &run, e),
        other => other?,
    };
    let audit = journal.audit();
    let clean = audit.is_clean();
    let mut out = std::io::stdout().lock();
    if g.json {
        let view = AuditView {
            run_id: run.to_string(),
            events: audit.events,
            clean,
            first_bad_seq: audit.first_bad.as_ref().map(|(s, _)| s.0),
            problem: audit.first_bad.as_ref().map(|(_, r)| r.clone()),
            ledger_mismatch: audit.ledger_mismatch.as_deref(),
            ledger: ledger_view(&audit.state, &audit.ledger),
            snapshot_mismatch: audit.snapshot_mismatch.as_deref(),
            recovered: output::recovery_lines(&audit.state),
            checks: checks_view(&audit.state),
            network: net_view(&audit.state),
        };
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        match &audit.first_bad {
            None => writeln!(out, "journal of run {run}: whole, {} events", audit.events)?,
            Some((seq, reason)) => writeln!(
                out,
                "journal of run {run}: CORRUPT at seq {seq}: {reason} ({} events read before it)",
                seq.0
            )?,
        }
        if let Some(m) = &audit.ledger_mismatch {
            writeln!(out, "ledger MISMATCH: {m}")?;
        }
        if let Some(m) = &audit.snapshot_mismatch {
            writeln!(out, "snapshot MISMATCH: {m}")?;
        }
        for line in output::recovery_lines(&audit.state) {
            writeln!(out, "{line}")?;
        }
        let checks = checks_view(&audit.state);
        if checks.verdicts > 0 {
            writeln!(
                out,
                "checks: {} verdicts, {} passed, {} failed",
                checks.verdicts, checks.passed, checks.failed
            )?;
        }
        let net = net_view(&audit.state);
        if net.attempts > 0 {
            writeln!(
                out,
                "network: {} sandboxed attempt(s), {} connection(s) allowed, {} denied",
                net.attempts, net.allowed, net.denied
            )?;
        }
        writeln!(out)?;
        output::print_ledger(&mut out, &audit.state, &audit.ledger)?;
    }
    Ok(if clean { Code::Ok } else { Code::Corrupt })
}

#[derive(Serialize)]
struct UnreadableView {
    run_id: String,
    clean: bool,
    problem: String,
}

/// A journal that cannot even be opened as whole (records lost, files sled cannot read): the
/// one line that says so, exit 4.
fn unreadable(g: &Global, run: &sortie_core::RunId, e: CliError) -> Result<Code> {
    let problem = e.cause();
    let mut out = std::io::stdout().lock();
    if g.json {
        let view = UnreadableView {
            run_id: run.to_string(),
            clean: false,
            problem,
        };
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        writeln!(out, "journal of run {run}: {problem}")?;
    }
    Ok(Code::Corrupt)
}
