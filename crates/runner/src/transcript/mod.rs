//! An attempt's transcript (#10): the agent's `stdout` (its whole event stream) and `stderr`,
//! in its attempt dir or beside it (`layout::attempt::AttemptFiles`).
//!
//! The files of this room, one reason each: `kept.rs` keeps the files under their cap (the
//! cut, its `.cut` record, sortie's `.read` acknowledgement) and reads them back across the
//! cut; `follow.rs` follows a supervised attempt through its files as if it were a child;
//! `reading.rs` reads one for a person (`sortie logs`, `--follow`); `list.rs` lists a run's
//! transcripts from the journal's placements and the files: where they are, how big, what the
//! cap cut, whether anything may still write to one, and `sortie gc`'s removal of them; `redact.rs`
//! masks the secrets an attempt was given (#34).

mod follow;
mod kept;
mod list;
mod reading;
mod redact;

pub use follow::{Followed, Watcher};
pub use kept::{
    CAP_VAR, Cap, Cut, DEFAULT_CAP, HARD_FACTOR, Kept, KeptReader, WholeLines, ack_moves, cut_file,
    read_cut, read_file, read_step, trim_ended, write_read,
};
pub(crate) use kept::{CHECK_EVERY, Keeper, Trimmer};
pub use list::{Collected, Transcript, gc, may_grow, of_task};
pub use reading::{CutNotice, Reading, Step};
pub use redact::mask_file;
pub(crate) use redact::mask_files;
