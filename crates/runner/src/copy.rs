//! `isolation = "copy"` (#14): a task's throwaway copy of its `cwd`, for a directory that is not
//! a git repository. The copy lives in the run dir (`copies/<task>`), is made before the task's
//! first attempt (each file reflinked where the filesystem can: a copy-on-write clone costs no
//! data; else copied), is where every attempt of the task runs, and is removed once the task
//! ended. The original is only read.
//!
//! Invariants:
//! - A copy is complete or absent: it is made under `<copy>.partial` and renamed into place, so a
//!   crash in the middle leaves a partial copy that the next attempt throws away and makes again.
//! - A later attempt of the task (a retry, or the attempt after a resume) finds the copy and
//!   goes on in it, as a worktree's attempts share their worktree.
//! - Nothing outside the original is copied: symbolic links are copied as links (never
//!   followed), devices, sockets and fifos are left out, and so is the state dir when it lies
//!   inside the original (the default `.sortie` of a batch whose tasks run in its directory):
//!   a copy never holds the run that makes it.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What making a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Files copied (reflinked or not).
    pub files: u64,
    /// Of these, the ones cloned copy-on-write (no data copied).
    pub reflinked: u64,
    /// Bytes copied (not counting the reflinked files').
    pub bytes: u64,
    /// False when the copy was already there (a later attempt of the task).
    pub made: bool,
}

/// Makes `dest`, a copy of the directory `src`, unless it is already there; `skip` (the state
/// dir) is left out wherever it lies inside `src`.
pub fn prepare(src: &Path, dest: &Path, skip: &Path) -> io::Result<Copied> {
    if dest.is_dir() {
        return Ok(Copied::default());
    }
    let meta = fs::metadata(src)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            src.display()
        )));
    }
    let partial = partial_of(dest);
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    let skip = fs::metadata(skip).ok().map(|m| (m.dev(), m.ino()));
    let mut copied = Copied {
        made: true,
        ..Copied::default()
    };
    copy_tree(src, &partial, skip, &mut copied)?;
    fs::rename(&partial, dest)?;
    Ok(copied)
}

/// Removes a task's copy (and a partial one); a copy already gone is fine.
pub fn discard(dest: &Path) -> io::Result<()> {
    for dir in [dest.to_path_buf(), partial_of(dest)] {
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn partial_of(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dest.with_file_name(name)
}

/// Copies the tree at `src` to `dest` (which does not exist), iteratively.
fn copy_tree(
    src: &Path,
    dest: &Path,
    skip: Option<(u64, u64)>,
    copied: &mut Copied,
) -> io::Result<()> {
    let mut dirs = vec![(src.to_path_buf(), dest.to_path_buf())];
    while let Some((from, to)) = dirs.pop() {
        let meta = fs::symlink_metadata(&from)?;
        fs::create_dir(&to)?;
        for entry in fs::read_dir(&from)? {
            let entry = entry?;
            let path = entry.path();
            let target = to.join(entry.file_name());
            let m = fs::symlink_metadata(&path)?;
            let kind = m.file_type();
            if kind.is_dir() {
                if skip == Some((m.dev(), m.ino())) {
                    continue;
                }
                dirs.push((path, target));
            } else if kind.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&path)?, &target)?;
            } else if kind.is_file() {
                copied.files += 1;
                match reflink_copy::reflink_or_copy(&path, &target)? {
                    None => copied.reflinked += 1,
                    Some(bytes) => copied.bytes += bytes,
                }
                fs::set_permissions(&target, fs::Permissions::from_mode(m.mode() & 0o7777))?;
            }
        }
        // After its entries: a read-only directory of the original stays read-only.
        fs::set_permissions(&to, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) {
        fs::create_dir_all(root.join("src/deep")).unwrap();
        fs::write(root.join("README"), "hello\n").unwrap();
        fs::write(root.join("src/deep/a.txt"), "a").unwrap();
        fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("README", root.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("outside")).unwrap();
        fs::create_dir_all(root.join(".sortie/runs/r/copies")).unwrap();
        fs::write(root.join(".sortie/runs/r/journal"), "j").unwrap();
    }

    #[test]
    fn a_copy_holds_the_tree_without_the_state_dir_and_is_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("orig");
        tree(&src);
        let dest = src.join(".sortie/runs/r/copies/0");
        let c = prepare(&src, &dest, &src.join(".sortie")).unwrap();
        assert_eq!((c.files, c.made), (3, true));
        // Each file was cloned copy-on-write or its bytes copied.
        assert!(c.reflinked == 3 || c.bytes > 0, "{c:?}");
        assert_eq!(
            fs::read_to_string(dest.join("src/deep/a.txt")).unwrap(),
            "a"
        );
        assert_eq!(
            fs::read_link(dest.join("link")).unwrap(),
            Path::new("README")
        );
        assert_eq!(
            fs::read_link(dest.join("outside")).unwrap(),
            Path::new("/etc")
        );
        let mode = fs::metadata(dest.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(!dest.join(".sortie").exists(), "the state dir is left out");
        // The next attempt goes on in the same copy.
        fs::write(dest.join("README"), "changed by attempt 1").unwrap();
        let again = prepare(&src, &dest, &src.join(".sortie")).unwrap();
        assert!(!again.made);
        assert_eq!(
            fs::read_to_string(dest.join("README")).unwrap(),
            "changed by attempt 1"
        );
        assert_eq!(fs::read_to_string(src.join("README")).unwrap(), "hello\n");
        discard(&dest).unwrap();
        assert!(!dest.exists());
        discard(&dest).unwrap();
    }

    #[test]
    fn a_partial_copy_is_made_again_and_a_missing_source_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("orig");
        tree(&src);
        let dest = dir.path().join("copies/3");
        fs::create_dir_all(dir.path().join("copies/3.partial/junk")).unwrap();
        prepare(&src, &dest, &dir.path().join("state")).unwrap();
        assert!(!dir.path().join("copies/3.partial").exists());
        assert!(!dest.join("junk").exists());
        assert!(
            dest.join(".sortie/runs/r/journal").exists(),
            "not the state dir here"
        );
        let err =
            prepare(&dir.path().join("gone"), &dir.path().join("copies/4"), &src).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(!dir.path().join("copies/4").exists());
    }
}
