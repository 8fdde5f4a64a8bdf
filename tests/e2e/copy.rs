//! `isolation = "copy"` (#14): a task runs in a throwaway copy of a directory that is not a git
//! repository; the original is untouched, the copy is gone once the task ended, and a missing
//! directory is refused before anything runs, by `run` and by `check`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::{Scratch, fake_command, task_view};

/// Every file under `dir` (relative path → contents).
fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read the dir") {
            let p = e.expect("a dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(dir)
                    .expect("under dir")
                    .display()
                    .to_string();
                out.insert(rel, std::fs::read_to_string(&p).expect("a text file"));
            }
        }
    }
    out
}

#[test]
fn a_copy_task_changes_its_copy_never_the_original_and_the_copy_is_discarded() {
    let s = Scratch::new();
    let data = s.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("notes.txt"), "original\n").unwrap();
    std::fs::write(data.join("sub/x.txt"), "x\n").unwrap();
    let before = files(&data);
    // One task in `data`; one in the batch's own directory, which holds the state dir (left
    // out of its copy).
    let edit = fake_command(&[
        "--cat",
        "notes.txt",
        "--write",
        "notes.txt:changed",
        "--write",
        "new.txt:made",
        "--answer",
        "edited",
    ]);
    let root = fake_command(&[
        "--cat",
        "data/notes.txt",
        "--cat",
        "state",
        "--write",
        "data/notes.txt:root-changed",
        "--answer",
        "root edited",
    ]);
    let b = s.write(
        "b.toml",
        &format!(
            "concurrency = 2\n\n\
             [[tasks]]\nlabel = \"edit\"\ncwd = \"data\"\nisolation = \"copy\"\n\
             output = \"out/edit.md\"\ncommand = {edit}\n\n\
             [[tasks]]\nlabel = \"root\"\nisolation = \"copy\"\noutput = \"out/root.md\"\n\
             command = {root}\n"
        ),
    );
    let out = s.run(&["run", "--run-id", "copied", b.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status("copied");
    for label in ["edit", "root"] {
        assert_eq!(task_view(&status, label)["state"], "completed", "{status}");
    }
    // The agents saw the original's files, and wrote into their copies.
    let edit_out = std::fs::read_to_string(s.path().join("out/edit.md")).unwrap();
    assert!(edit_out.contains("cat notes.txt: original"), "{edit_out}");
    let root_out = std::fs::read_to_string(s.path().join("out/root.md")).unwrap();
    assert!(
        root_out.contains("cat data/notes.txt: original"),
        "{root_out}"
    );
    assert!(
        root_out.contains("(missing state)"),
        "no state dir in the copy: {root_out}"
    );
    // The original is untouched, file by file.
    assert_eq!(files(&data), before);
    assert!(!data.join("new.txt").exists());
    // And the copies are gone.
    let copies = s.state_dir().join("runs/copied/copies");
    let left: Vec<_> = std::fs::read_dir(&copies)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "copies left behind: {left:?}");
    // The journal says the isolation.
    let events = s.events("copied");
    let batch = &events[0]["event"]["RunStarted"]["batch"];
    assert_eq!(batch["tasks"][0]["isolation"], "copy");
}

#[test]
fn a_copy_of_a_missing_directory_is_refused_by_run_and_by_check() {
    let s = Scratch::new();
    let command = fake_command(&["--answer", "never"]);
    let b = s.write(
        "b.toml",
        &format!(
            "[[tasks]]\nlabel = \"gone\"\ncwd = \"nowhere\"\nisolation = \"copy\"\n\
             command = {command}\n"
        ),
    );
    let file = b.display().to_string();
    for cmd in ["run", "check"] {
        let out = s.run(&[cmd, &file]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}{stdout}");
        let said = format!("{stderr}{stdout}");
        assert!(
            said.contains(&format!("{file}:4: field `isolation`")),
            "{cmd}: {said}"
        );
        assert!(
            said.contains("copies its cwd") && said.contains("nowhere does not exist"),
            "{cmd}: {said}"
        );
    }
    assert!(s.listed_runs().is_empty(), "nothing ran");
}

/// #32: a copy task without `output` (completed, failed, or skipped by a failed dependency)
/// leaves no copy behind: the copies used to stay in `runs/<id>/copies/` for good.
#[test]
fn a_copy_task_without_output_leaves_no_copy() {
    let s = Scratch::new();
    let data = s.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "original\n").unwrap();
    let edit = fake_command(&["--write", "notes.txt:changed", "--answer", "edited"]);
    let fail = fake_command(&["--write", "notes.txt:half", "--exit", "3"]);
    let b = s.write(
        "b.toml",
        &format!(
            "[defaults]\ncwd = \"data\"\nisolation = \"copy\"\nmax_retries = 0\n\n\
             [[tasks]]\nlabel = \"edit\"\ncommand = {edit}\n\n\
             [[tasks]]\nlabel = \"fail\"\ncommand = {fail}\n"
        ),
    );
    let out = s.run(&["run", "--run-id", "bare", b.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status("bare");
    assert_eq!(task_view(&status, "edit")["state"], "completed", "{status}");
    assert_eq!(task_view(&status, "fail")["state"], "failed", "{status}");
    let copies = s.state_dir().join("runs/bare/copies");
    let left: Vec<_> = std::fs::read_dir(&copies)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "copies left in {}: {left:?}",
        copies.display()
    );
    assert_eq!(
        std::fs::read_to_string(data.join("notes.txt")).unwrap(),
        "original\n"
    );
}
