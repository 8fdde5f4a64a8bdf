//! The machine-wide cap on live attempts across every run of a user (issue 14): a pool of
//! `SORTIE_MACHINE_SLOTS` slot files in the user's state (`SORTIE_SLOTS_DIR`, else
//! `$XDG_STATE_HOME/sortie/slots`, else `~/.local/state/sortie/slots`). An attempt holds one
//! slot, an exclusive `flock` on `slot-<n>`, from before its spawn to its end; a run that
//! crashes frees its slots with its process (the kernel drops the locks). Unset or 0: no cap.
//!
//! An attempt that finds no free slot waits (polling every [`POLL`]), and a stop request
//! (interrupt, cancel, a run budget) ends the wait. The run's own `concurrency` still bounds
//! what it launches; the cap bounds what is alive across runs.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

/// How often a waiting attempt tries the slots again.
pub const POLL: Duration = Duration::from_millis(100);

/// The variable that sets the cap.
pub const SLOTS_VAR: &str = "SORTIE_MACHINE_SLOTS";

/// The variable that names the slots' directory.
pub const DIR_VAR: &str = "SORTIE_SLOTS_DIR";

/// The variable sortie sets in its attempts' environment: how deep a run started there is nested
/// (1 inside a top-level run's attempt). A nested run takes no machine slot: the attempt that
/// runs it holds one for it (it would otherwise wait for the very slot its parent holds).
pub const DEPTH_VAR: &str = "SORTIE_DEPTH";

/// How deep runs may nest: a run started at a greater depth is refused at once.
pub const MAX_DEPTH: u32 = 3;

/// This process's nesting depth ([`DEPTH_VAR`]; 0 for a run started by a user).
pub fn depth() -> u32 {
    static DEPTH: OnceLock<u32> = OnceLock::new();
    *DEPTH.get_or_init(|| {
        std::env::var(DEPTH_VAR)
            .ok()
            .and_then(|d| d.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Refuses a run nested deeper than [`MAX_DEPTH`].
pub fn check_depth() -> crate::Result<()> {
    match depth() {
        d if d > MAX_DEPTH => Err(crate::Error::TooDeep(d)),
        _ => Ok(()),
    }
}

/// The machine-wide pool, as the environment configures it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// How many attempts may be alive at once across runs.
    pub slots: u32,
    /// Where the slot files are.
    pub dir: PathBuf,
}

/// A slot held: dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _lock: Flock<File>,
    /// Which slot.
    pub index: u32,
}

impl Pool {
    /// The pool of this process's environment, read once; None when there is no cap, and
    /// for a nested run (its parent's attempt holds a slot for it: [`DEPTH_VAR`]).
    pub fn configured() -> Option<&'static Pool> {
        static POOL: OnceLock<Option<Pool>> = OnceLock::new();
        POOL.get_or_init(|| {
            if depth() > 0 {
                return None;
            }
            Pool::from_vars(|k| std::env::var(k).ok())
        })
        .as_ref()
    }

    /// The pool `var` describes (for tests: any lookup).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<Pool> {
        let slots: u32 = var(SLOTS_VAR)?.trim().parse().ok()?;
        if slots == 0 {
            return None;
        }
        let dir = var(DIR_VAR)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                var("XDG_STATE_HOME")
                    .filter(|d| !d.is_empty())
                    .map(|d| PathBuf::from(d).join("sortie/slots"))
            })
            .or_else(|| {
                var("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/state/sortie/slots"))
            })?;
        Some(Pool { slots, dir })
    }

    /// Takes a free slot, if any.
    pub fn try_take(&self) -> std::io::Result<Option<Slot>> {
        std::fs::create_dir_all(&self.dir)?;
        for index in 0..self.slots {
            let path = self.dir.join(format!("slot-{index}"));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                return Ok(Some(Slot { _lock: lock, index }));
            }
        }
        Ok(None)
    }

    /// How many slots other processes (or this one) hold now.
    pub fn held(&self) -> u32 {
        (0..self.slots)
            .filter(|i| {
                let path = self.dir.join(format!("slot-{i}"));
                let Ok(file) = File::open(&path) else {
                    return false;
                };
                Flock::lock(file, FlockArg::LockSharedNonblock).is_err()
            })
            .count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(dir: &std::path::Path, slots: u32) -> Pool {
        Pool {
            slots,
            dir: dir.to_path_buf(),
        }
    }

    #[test]
    fn slots_are_exclusive_and_a_dropped_one_is_free_again() {
        let tmp = tempfile::tempdir().unwrap();
        let p = pool(tmp.path(), 2);
        let a = p.try_take().unwrap().expect("a free slot");
        let b = p.try_take().unwrap().expect("a second free slot");
        assert_ne!(a.index, b.index);
        assert!(p.try_take().unwrap().is_none(), "the cap is 2");
        assert_eq!(p.held(), 2);
        drop(a);
        assert!(p.try_take().unwrap().is_some(), "freed with its holder");
    }

    #[test]
    fn the_environment_configures_the_pool() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(Pool::from_vars(vars(&[("HOME", "/h")])), None, "no cap");
        assert_eq!(
            Pool::from_vars(vars(&[(SLOTS_VAR, "0"), ("HOME", "/h")])),
            None,
            "0 is off"
        );
        assert_eq!(
            Pool::from_vars(vars(&[(SLOTS_VAR, "8"), ("HOME", "/h")])),
            Some(pool(
                std::path::Path::new("/h/.local/state/sortie/slots"),
                8
            ))
        );
        assert_eq!(
            Pool::from_vars(vars(&[(SLOTS_VAR, "2"), (DIR_VAR, "/s"), ("HOME", "/h")])),
            Some(pool(std::path::Path::new("/s"), 2))
        );
    }
}
