//! The programs that outlive sortie, and sortie's side of them: the per-attempt supervisor
//! (`sortie __supervise`, `supervise.rs`), the per-run shepherd (`sortie __shepherd`,
//! `shepherd.rs`) and its client (`shepherd_client.rs`), and the shepherd's status log of its
//! attempts (`status_log.rs`); #34: the exec wrapper of a sandboxed attempt (`sortie
//! __sandbox`, `sandbox.rs`; its network `sandbox_net.rs`, `sandbox_relay.rs`, `nft.rs`). An attempt they start keeps running, writing its files, when
//! sortie dies; a resumed sortie finds it again by its attempt dir (`read_started`,
//! [`read_exit`], [`presence`]).
//!
//! They start their children themselves (a supervisor its agent, the shepherd each attempt),
//! the one room besides `process` that creates a `Command`. The files they write and their
//! formats are `layout::attempt`'s; the transcript's cap they keep is `transcript`'s.

mod nft;
pub(crate) mod sandbox;
pub(crate) mod sandbox_net;
mod sandbox_relay;
mod shepherd;
mod shepherd_client;
mod status_log;
mod supervise;

pub use sandbox::{SANDBOX_ARG, Support, probe, sandbox_main};
pub use shepherd::{SHEPHERD_ARG, SHEPHERD_MARKER, SWEEP_EVERY, shepherd_main};
pub use shepherd_client::{Forget, Shepherded, release_shepherds, spawn_shepherded};
pub use supervise::{
    DirPresence, SUPERVISE_ARG, SupervisorChild, presence, read_exit, read_nospace, read_started,
    record_exit, spawn_supervised, supervise_main,
};
