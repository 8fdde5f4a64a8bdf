//! The program of an attempt, found on `PATH` once per distinct name, as a shell's command hash
//! does: a bare name (`true`, `claude`) is otherwise looked up again in the child of every
//! spawn, one failing `execve` per `PATH` entry before the right one (eight for `true` here).
//! A resolved program is also a path, which lets the standard library start the child with
//! `posix_spawn` (a `vfork`-like clone) instead of a `fork` of the whole parent, even when the
//! attempt's environment sets `PATH`.
//!
//! What is cached is only ever a positive answer: a name not found, or found only where it is
//! not executable, is left to the spawn itself (and its error is the same as without the
//! cache). A cached program that is gone or not executable any more fails its spawn with
//! `NotFound` or `PermissionDenied`: the caller then forgets it ([`forget`]) and spawns by the
//! bare name once more, so a program moved or removed mid-run is found where it is now. A
//! program installed mid-run earlier on `PATH` than the cached one is not seen (a shell's
//! `hash -r` has the same limit).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::sync::lock;

/// The search path when none is set (glibc's `execvp` default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

type Key = (String, OsString);

fn cache() -> &'static Mutex<HashMap<Key, PathBuf>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, PathBuf>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The `PATH` a child gets: the attempt's own (`env`, the variables added to ours) when it sets
/// one, else ours.
fn search_path(env: &[(String, String)]) -> OsString {
    match env.iter().rev().find(|(k, _)| k == "PATH") {
        Some((_, v)) => OsString::from(v),
        None => std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
    }
}

/// Where `program` is on the child's `PATH` (an absolute path), when it is a bare name found
/// as an executable file in an absolute directory of it. `None`: spawn it by its name (a path
/// already, or not found, or a relative `PATH` entry that depends on the child's cwd).
pub(crate) fn resolve(program: &str, env: &[(String, String)]) -> Option<PathBuf> {
    if program.is_empty() || program.contains('/') {
        return None;
    }
    let path = search_path(env);
    let key = (program.to_owned(), path);
    if let Some(found) = lock(cache()).get(&key) {
        return Some(found.clone());
    }
    let found = search(program, &key.1)?;
    lock(cache()).insert(key, found.clone());
    Some(found)
}

/// Starts `program` through `spawn`: by the path [`resolve`] found, else by its name. A cached
/// path that no longer runs (moved, or lost its mode) is forgotten and the name is spawned
/// again, so the error is the one a spawn by name gives.
pub(crate) fn spawn_resolved<T>(
    program: &str,
    env: &[(String, String)],
    mut spawn: impl FnMut(&Path) -> io::Result<T>,
) -> io::Result<T> {
    let Some(path) = resolve(program, env) else {
        return spawn(Path::new(program));
    };
    match spawn(&path) {
        Err(e) if is_not_runnable(&e) => {
            forget(program, env);
            spawn(Path::new(program))
        }
        other => other,
    }
}

/// A spawn that failed because the program is not there or not executable.
fn is_not_runnable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    )
}

/// Forgets what [`resolve`] said for `program` (its spawn failed: it moved, or lost its mode).
pub(crate) fn forget(program: &str, env: &[(String, String)]) {
    let key = (program.to_owned(), search_path(env));
    lock(cache()).remove(&key);
}

/// `execvp`'s search, stopping at the first entry that would run: an executable regular file.
/// A relative or empty entry before it (resolved against the child's cwd) gives up.
fn search(program: &str, path: &OsStr) -> Option<PathBuf> {
    for dir in path.as_bytes().split(|b| *b == b':') {
        let dir = Path::new(OsStr::from_bytes(dir));
        if !dir.is_absolute() {
            return None;
        }
        let candidate = dir.join(program);
        if is_executable_file(&candidate) {
            return Some(candidate);
        }
    }
    None
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
        && nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn finds_the_first_executable_on_the_attempts_path() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        script(a.path(), "tool-r1", 0o644);
        let want = script(b.path(), "tool-r1", 0o755);
        let path = format!("{}:{}", a.path().display(), b.path().display());
        let env = vec![("PATH".to_owned(), path)];
        assert_eq!(resolve("tool-r1", &env), Some(want));
        assert_eq!(resolve("missing-r1", &env), None);
        assert_eq!(resolve("./tool-r1", &env), None);
    }

    #[test]
    fn a_relative_entry_first_leaves_the_search_to_the_child() {
        let b = tempfile::tempdir().unwrap();
        script(b.path(), "tool-r2", 0o755);
        let env = vec![("PATH".to_owned(), format!("bin:{}", b.path().display()))];
        assert_eq!(resolve("tool-r2", &env), None);
    }

    #[test]
    fn a_forgotten_program_is_looked_up_again() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let first = script(a.path(), "tool-r3", 0o755);
        let path = format!("{}:{}", a.path().display(), b.path().display());
        let env = vec![("PATH".to_owned(), path)];
        assert_eq!(resolve("tool-r3", &env), Some(first.clone()));
        std::fs::remove_file(&first).unwrap();
        let moved = script(b.path(), "tool-r3", 0o755);
        // Cached until its spawn fails and the caller forgets it.
        assert_eq!(resolve("tool-r3", &env), Some(first));
        forget("tool-r3", &env);
        assert_eq!(resolve("tool-r3", &env), Some(moved));
    }
}
