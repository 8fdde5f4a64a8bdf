//! End-to-end tests that drive the built `sortie` binary with plain `std::process`, against
//! fake agents the project ships (`examples/agents/fake-agent.py`).

#![allow(
    clippy::disallowed_methods,
    reason = "the tests run the sortie binary and tools"
)]

mod agents;
mod apply;
mod bad_input;
mod batches;
mod board;
mod cli_docs;
mod cli_edge;
// #37: control characters shown, not obeyed
mod control;
mod crash;
mod damage;
mod detach;
mod escapes;
mod faults;
mod graphs;
// #33: a judge over samples.
mod judge;
mod mixed;
// #14: shared rate limits.
mod pools;
// #37: budgets bind an agent that reports no cost.
mod prices;
mod real_claude;
mod real_codex;
mod real_pi;
// #34: the real CLIs sandboxed.
mod real_sandbox;
// #13: roles and sessions with the real CLIs.
mod real_sessions;
// #33: feedback rounds with the real CLIs.
mod real_verify;
mod report;
// #33: samples, pass@k, best-of-N
mod samples;
// #34: the kernel sandbox.
mod sandbox;
mod secrets;
mod signals;
mod supervised;
// #11
mod ray;
mod slurm;
mod slurm_crash;
// #11: ends Slurm causes, Ctrl-C, queue time
mod slurm_stops;
mod summary;
mod support;
mod torture;
// #37: views as of a moment
mod verify;
mod views;
mod worktree;
// Issue 13: structured results.
mod real_structured;
mod structured;
// #10: transcripts
mod transcripts;
// #14: isolation = "copy"
mod copy;
// #35: `sortie serve` in a browser.
mod serve;
