//! The state directory: where runs live, who owns a run (an exclusive lock file plus the
//! owner's pid), the private side file that keeps environment values out of the journal, and
//! run ids.
//!
//! Layout: `<state-dir>/runs/<run-id>/` holds the journal (owned by `sortie-journal`),
//! `owner.lock` (held with `flock` by the one live process of the run), `owner.pid`, and
//! `env.json` (mode 0600: the tasks' extra environment values, which never enter the journal).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use sortie_core::RunId;

use crate::{Error, Result};

/// Creates the state dir (mode 0700) and its `runs/` if missing.
pub fn ensure_state_dir(state_dir: &Path) -> Result<()> {
    for dir in [state_dir.to_path_buf(), state_dir.join("runs")] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
    }
    Ok(())
}

/// The directory of one run.
pub fn run_dir(state_dir: &Path, run: &RunId) -> PathBuf {
    sortie_journal::run_dir(state_dir, run)
}

/// The current wall-clock time (it lives in [`crate::clock`]).
pub use crate::clock::now;

/// A fresh run id: `YYYYMMDD-HHMMSS-xxxx` (UTC) with a suffix from the pid and the clock.
pub fn new_run_id() -> RunId {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let mix = (u64::from(now.subsec_nanos()) ^ (u64::from(std::process::id()) << 17))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let id = format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{:04x}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        mix >> 48
    );
    // The format only uses allowed characters.
    RunId::new(id).unwrap_or_else(|_| RunId::new("run").unwrap_or_else(|e| panic!("{e}")))
}

/// Days since 1970-01-01 to a (year, month, day) date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Proof that this process owns a run: the lock is released when it is dropped (or when the
/// process dies, which is what makes a crashed run resumable).
#[derive(Debug)]
pub struct OwnerLock {
    _lock: Flock<File>,
}

/// Who holds a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A live process holds the run.
    Live {
        /// Its pid, when recorded.
        pid: Option<u32>,
    },
    /// Nobody holds it.
    Free,
}

fn lock_path(run_dir: &Path) -> PathBuf {
    run_dir.join("owner.lock")
}

fn open_lock_file(run_dir: &Path) -> Result<File> {
    let path = lock_path(run_dir);
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| Error::Io { path, source })
}

/// Takes ownership of a run, or says which pid holds it.
pub fn acquire(run_dir: &Path) -> Result<OwnerLock> {
    let file = open_lock_file(run_dir)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            let pid_path = run_dir.join("owner.pid");
            write_atomic(&pid_path, std::process::id().to_string().as_bytes(), 0o600)?;
            Ok(OwnerLock { _lock: lock })
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(Error::Live {
            run_dir: run_dir.to_path_buf(),
            pid: read_pid(run_dir),
        }),
        Err((_, errno)) => Err(Error::Io {
            path: lock_path(run_dir),
            source: std::io::Error::from_raw_os_error(errno as i32),
        }),
    }
}

/// Whether a live process holds the run (without taking it).
pub fn owner(run_dir: &Path) -> Owner {
    let Ok(file) = File::open(lock_path(run_dir)) else {
        return Owner::Free;
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_shared) => Owner::Free,
        Err(_) => Owner::Live {
            pid: read_pid(run_dir),
        },
    }
}

fn read_pid(run_dir: &Path) -> Option<u32> {
    fs::read_to_string(run_dir.join("owner.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Writes a file atomically: a temp file in the same directory, fsync, then rename.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)?;
    fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// Keeps the tasks' environment values in `env.json` (0600), outside the journal.
pub fn save_env(run_dir: &Path, env: &[Vec<(String, String)>]) -> Result<()> {
    let bytes = serde_json::to_vec(env).map_err(|e| Error::Io {
        path: run_dir.join("env.json"),
        source: std::io::Error::other(e),
    })?;
    write_atomic(&run_dir.join("env.json"), &bytes, 0o600)
}

/// Reads the environment values saved by [`save_env`]; a run without any has none.
pub fn load_env(run_dir: &Path, tasks: usize) -> Result<Vec<Vec<(String, String)>>> {
    let path = run_dir.join("env.json");
    let mut env: Vec<Vec<(String, String)>> = match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Io {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(Error::Io { path, source }),
    };
    env.resize(tasks, Vec::new());
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_look_like_dates() {
        let id = new_run_id();
        assert_eq!(id.as_str().len(), 20, "{id}");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
    }

    #[test]
    fn the_lock_names_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(owner(dir.path()), Owner::Free);
        let lock = acquire(dir.path()).unwrap();
        assert_eq!(
            owner(dir.path()),
            Owner::Live {
                pid: Some(std::process::id())
            }
        );
        match acquire(dir.path()) {
            Err(Error::Live { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Live, got {other:?}"),
        }
        drop(lock);
        assert_eq!(owner(dir.path()), Owner::Free);
    }
}
