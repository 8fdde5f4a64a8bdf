//! #10: whether an attempt's exit is recorded, read the tests' own way: an `exit` file in its
//! attempt dir (a per-attempt supervisor's, or the direct executor's), or an `exit` line of
//! its dir's name in the run's shepherd's status log beside it (`status.log`; the product's
//! reader, which also checks each line's checksum, is `sortie_runner::process`).

use std::path::Path;

/// The shepherd's status log, in the directory of the attempt dirs.
pub const STATUS_LOG: &str = "status.log";

/// Whether the attempt in `dir` has its exit recorded.
pub fn exit_recorded(dir: &Path) -> bool {
    if dir.join("exit").exists() {
        return true;
    }
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return false;
    };
    let prefix = format!("{name} exit ");
    std::fs::read_to_string(parent.join(STATUS_LOG))
        .is_ok_and(|log| log.lines().any(|l| l.starts_with(&prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_file_or_an_exit_line_of_the_dir_records_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b, c) = (
            tmp.path().join("0.1"),
            tmp.path().join("1.1"),
            tmp.path().join("2.1"),
        );
        std::fs::create_dir(&a).expect("mkdir");
        std::fs::write(a.join("exit"), "code 0\n").expect("write");
        std::fs::write(
            tmp.path().join(STATUS_LOG),
            "1.1 started 1 2 3 4 #0\n1.1 exit code 0 #0\n2.1 started 5 6 7 8 #0\n",
        )
        .expect("write");
        assert!(exit_recorded(&a));
        assert!(exit_recorded(&b));
        assert!(!exit_recorded(&c));
        assert!(!exit_recorded(&tmp.path().join("3.1")));
    }
}
