//! Worktree isolation end to end: each isolated task works in its own git worktree under the
//! state dir, on `sortie/<run>/<label>`; a changed worktree is kept with a patch, an unchanged
//! one is removed with its branch; `include_wip` seeds the work in progress; and SIGKILL at any
//! step (setup, attempt, finalize) followed by resume leaves exactly the worktrees and branches
//! the journal says, nothing leaked, nothing lost.
//!
//! The repositories are made here with `git init`; the identity is passed on the command line
//! and in the environment, since a CI machine has none configured.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use sortie_runner::engine::TEST_PAUSE_AFTER as PAUSE_AFTER;

use crate::support::{Scratch, event_kind, fake_command, poll, unique_run};
use sortie_testkit::{Events, git};

/// A repository under the scratch dir: `shared.txt` ("base"), `sub/inner.txt`, and a
/// `.gitignore` naming `ignored.txt`, all committed.
fn repo(s: &Scratch) -> PathBuf {
    let dir = s.path().join("repo");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    git(&dir, &["init", "-q"]);
    std::fs::write(dir.join("shared.txt"), "base\n").expect("write");
    std::fs::write(dir.join("sub/inner.txt"), "inner\n").expect("write");
    std::fs::write(dir.join(".gitignore"), "ignored.txt\n").expect("write");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "initial"]);
    dir
}

/// One task: label, fake-agent arguments, extra TOML lines.
type Task<'a> = (&'a str, Vec<&'a str>, String);

/// Writes a batch of isolated tasks running in `cwd`.
fn batch(s: &Scratch, cwd: &Path, concurrency: u32, tasks: &[Task<'_>]) -> String {
    let mut toml = format!(
        "concurrency = {concurrency}\n\n[defaults]\nisolation = \"worktree\"\nkill_grace = \"1s\"\n\
         cwd = {:?}\n",
        cwd.display().to_string()
    );
    for (label, args, extra) in tasks {
        let mut args = args.clone();
        args.push("--quiet");
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n{extra}\n",
            fake_command(&args)
        ));
    }
    s.write("batch.toml", &toml).display().to_string()
}

fn start(s: &Scratch, args: &[&str], pause: Option<&str>) -> Child {
    let mut c = s.sortie();
    // A file, not a pipe: a paused run is never blocked on a full pipe.
    let err = std::fs::File::create(s.path().join("sortie.err")).expect("log file");
    c.args(args).stdout(Stdio::null()).stderr(err);
    match pause {
        Some(p) => c.env(PAUSE_AFTER, p),
        None => c.env_remove(PAUSE_AFTER),
    };
    c.spawn().expect("spawn sortie")
}

/// Panics, saying how the run ended, when a run that should pause has exited instead.
fn exited(child: &mut Child, s: &Scratch, run: &str) -> bool {
    if let Some(status) = child.try_wait().expect("try_wait") {
        let err = std::fs::read_to_string(s.path().join("sortie.err")).unwrap_or_default();
        let ends: Vec<String> = s
            .try_events(run)
            .unwrap_or_default()
            .iter()
            .filter(|e| event_kind(e).0 == "TaskFinished")
            .map(|e| e.to_string())
            .collect();
        panic!("the run exited ({status}) instead of pausing: {err}\n{ends:#?}");
    }
    false
}

fn kill9(mut child: Child) {
    assert!(
        sortie_testkit::kill9(&mut child),
        "the paused run exited by itself"
    );
}

fn has_event(s: &Scratch, run: &str, kind: &str) -> bool {
    s.try_events(run)
        .is_some_and(|events| events.iter().any(|e| event_kind(e).0 == kind))
}

/// `(path, branch)` of every worktree git knows besides the main one, and whether any is
/// prunable (registered while its directory is gone).
fn git_worktrees(repo: &Path) -> (BTreeSet<(String, String)>, bool) {
    let list = git(repo, &["worktree", "list", "--porcelain"]);
    let mut out = BTreeSet::new();
    let mut prunable = false;
    for block in list.split("\n\n") {
        let mut path = None;
        let mut branch = String::new();
        for line in block.lines() {
            if let Some(p) = line.strip_prefix("worktree ") {
                path = Some(p.to_owned());
            } else if let Some(b) = line.strip_prefix("branch refs/heads/") {
                branch = b.to_owned();
            } else if line.starts_with("prunable") {
                prunable = true;
            }
        }
        if let Some(p) = path
            && Path::new(&p) != repo.canonicalize().expect("canonical repo")
        {
            out.insert((p, branch));
        }
    }
    (out, prunable)
}

fn sortie_branches(repo: &Path) -> BTreeSet<String> {
    git(
        repo,
        &["branch", "--list", "sortie/*", "--format=%(refname:short)"],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// What the journal says of each task's worktree.
#[derive(Debug)]
struct Fate {
    path: String,
    branch: String,
    changed: bool,
    diff: Option<String>,
}

/// Checks the run ended, the journal has one plan and one finalize per isolated task, and git
/// holds exactly the worktrees and branches the journal kept: nothing leaked, nothing lost.
/// Returns each task's fate, by label.
fn assert_matches_journal(s: &Scratch, run: &str, repo: &Path) -> BTreeMap<String, Fate> {
    let events = s.events(run);
    let labels = crate::support::labels(&events);
    let mut fates = BTreeMap::new();
    for (i, label) in labels.iter().enumerate() {
        let planned = events.of(i as u64, "WorktreePlanned");
        let set_up = events.of(i as u64, "TaskSetUp");
        let finals = events.of(i as u64, "WorktreeFinalized");
        assert_eq!(events.of(i as u64, "TaskFinished").len(), 1, "{label}");
        if planned.is_empty() {
            // Ended before its setup began (e.g. cancelled while queued): nothing to finalize.
            assert!(set_up.is_empty() && finals.is_empty(), "{label}");
            continue;
        }
        assert_eq!(
            planned.len(),
            1,
            "{label}: planned once, reused after resume"
        );
        assert_eq!(
            set_up.len(),
            1,
            "{label}: set up once; {:?}",
            events.of(i as u64, "TaskFinished")
        );
        assert_eq!(finals.len(), 1, "{label}: finalized once");
        let p = planned[0];
        let path = p["path"].as_str().expect("path").to_owned();
        assert_eq!(set_up[0]["worktree"].as_str(), Some(path.as_str()));
        let branch = p["branch"].as_str().expect("branch").to_owned();
        assert_eq!(branch, format!("sortie/{run}/{label}"));
        assert!(
            path.ends_with(&format!("worktrees/{run}/{label}")),
            "{label}: under the state dir: {path}"
        );
        fates.insert(
            label.clone(),
            Fate {
                path,
                branch,
                changed: finals[0]["changed"].as_bool().expect("changed"),
                diff: finals[0]["diff"].as_str().map(str::to_owned),
            },
        );
    }
    let kept: BTreeSet<(String, String)> = fates
        .values()
        .filter(|f| f.changed)
        .map(|f| (f.path.clone(), f.branch.clone()))
        .collect();
    let (worktrees, prunable) = git_worktrees(repo);
    assert_eq!(worktrees, kept, "git's worktrees are the kept ones");
    assert!(!prunable, "no stale worktree registration");
    let branches: BTreeSet<String> = kept.iter().map(|(_, b)| b.clone()).collect();
    assert_eq!(
        sortie_branches(repo),
        branches,
        "branches are the kept ones"
    );
    for (label, f) in &fates {
        let patch = s
            .state_dir()
            .join("runs")
            .join(run)
            .join("patches")
            .join(format!("{label}.patch"));
        assert_eq!(Path::new(&f.path).exists(), f.changed, "{label}: {f:?}");
        assert_eq!(patch.exists(), f.changed, "{label}: patch file");
        assert_eq!(f.diff.is_some(), f.changed, "{label}: diff summary");
    }
    // Nothing else under the run's worktree dir (no half-made worktree, no scratch index).
    let dir = s.state_dir().join("worktrees").join(run);
    let mut left: BTreeSet<String> = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            left.insert(e.path().display().to_string());
        }
    }
    let kept_paths: BTreeSet<String> = kept.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        left,
        kept_paths,
        "only kept worktrees under {}",
        dir.display()
    );
    s.audit_clean(run);
    fates
}

fn patch_of(s: &Scratch, run: &str, label: &str) -> String {
    std::fs::read_to_string(
        s.state_dir()
            .join("runs")
            .join(run)
            .join("patches")
            .join(format!("{label}.patch")),
    )
    .expect("a patch file")
}

/// Ten tasks at concurrency 10 edit the same file, each in its own worktree: all ten changes
/// are kept on their branches with patches and diff summaries; the repository's own checkout is
/// untouched; a task that changed nothing leaves no worktree or branch; a failed task's change
/// is kept too; a task whose cwd is a subdirectory runs in the worktree's subdirectory.
#[test]
fn ten_tasks_edit_the_same_file_in_their_own_worktrees() {
    let s = Scratch::new();
    let repo = repo(&s);
    let texts: Vec<String> = (0..10)
        .map(|i| format!("shared.txt:change from t{i}"))
        .collect();
    let mut tasks: Vec<Task<'_>> = texts
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let label: &str = Box::leak(format!("t{i}").into_boxed_str());
            (label, vec!["--write", w.as_str()], String::new())
        })
        .collect();
    tasks.push(("idle", vec!["--answer", "nothing to do"], String::new()));
    tasks.push((
        "broken",
        vec!["--write", "shared.txt:half done", "--exit", "1"],
        String::new(),
    ));
    let sub = format!("cwd = {:?}", repo.join("sub").display().to_string());
    tasks.push(("nested", vec!["--write", "inner.txt:from nested"], sub));
    let file = batch(&s, &repo, 10, &tasks);
    let run = unique_run("wt-ten");
    let out = s.run(&["run", "--run-id", &run, &file]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "one task failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let fates = assert_matches_journal(&s, &run, &repo);
    for i in 0..10 {
        let label = format!("t{i}");
        let f = &fates[&label];
        assert!(f.changed, "{label} is kept");
        assert!(
            f.diff.as_deref().is_some_and(|d| d.contains("shared.txt")),
            "{label}: {f:?}"
        );
        let text = std::fs::read_to_string(Path::new(&f.path).join("shared.txt")).expect("read");
        assert_eq!(
            text,
            format!("base\nchange from t{i}\n"),
            "{label}'s own edit"
        );
        let patch = patch_of(&s, &run, &label);
        assert!(patch.contains(&format!("+change from t{i}")), "{patch}");
        assert_eq!(patch.matches("+change from").count(), 1, "{patch}");
    }
    assert!(
        !fates["idle"].changed,
        "a task that changed nothing is removed"
    );
    assert!(fates["broken"].changed, "a failed task's change is kept");
    assert!(patch_of(&s, &run, "broken").contains("+half done"));
    let nested = &fates["nested"];
    assert!(nested.changed);
    assert_eq!(
        std::fs::read_to_string(Path::new(&nested.path).join("sub/inner.txt")).expect("read"),
        "inner\nfrom nested\n",
        "the agent ran in the worktree's sub/"
    );
    assert!(patch_of(&s, &run, "nested").contains("sub/inner.txt"));
    assert_eq!(
        std::fs::read_to_string(repo.join("shared.txt")).expect("read"),
        "base\n",
        "the repository's checkout is untouched"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    let events = s.events(&run);
    let broken = events.of(11, "TaskFinished");
    assert_eq!(broken[0]["result"]["state"], "failed");
}

/// `include_wip` seeds the worktree with the staged and unstaged changes and the untracked
/// files (not the ignored ones): the agent sees them. A worktree holding only that seed counts
/// as unchanged and is removed; a changed one's patch holds the agent's change only. The
/// repository's own index and files are left as they were.
#[test]
fn include_wip_seeds_the_worktree_and_wip_alone_counts_unchanged() {
    let s = Scratch::new();
    let repo = repo(&s);
    std::fs::write(repo.join("shared.txt"), "base\nwip line\n").expect("write");
    std::fs::write(repo.join("staged.txt"), "staged\n").expect("write");
    git(&repo, &["add", "staged.txt"]);
    std::fs::write(repo.join("untracked.txt"), "untracked\n").expect("write");
    std::fs::write(repo.join("ignored.txt"), "ignored\n").expect("write");
    let status_before = git(&repo, &["status", "--porcelain"]);
    let wip = "include_wip = true".to_owned();
    let cats = vec![
        "--cat",
        "shared.txt",
        "--cat",
        "staged.txt",
        "--cat",
        "untracked.txt",
        "--cat",
        "ignored.txt",
    ];
    let mut edit = cats.clone();
    edit.extend(["--write", "untracked.txt:agent"]);
    let tasks: Vec<Task<'_>> = vec![
        ("look", cats, wip.clone()),
        ("edit", edit, wip),
        ("plain", vec!["--cat", "untracked.txt"], String::new()),
    ];
    let file = batch(&s, &repo, 3, &tasks);
    let run = unique_run("wt-wip");
    let out = s.run(&["run", "--run-id", &run, &file]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fates = assert_matches_journal(&s, &run, &repo);
    assert!(
        !fates["look"].changed,
        "a WIP-only worktree counts unchanged"
    );
    assert!(!fates["plain"].changed);
    assert!(fates["edit"].changed);

    let events = s.events(&run);
    let text = |i: usize| {
        events.of(i as u64, "TaskFinished")[0]["result"]["text"]
            .as_str()
            .expect("text")
            .to_owned()
    };
    for i in [0, 1] {
        let t = text(i);
        assert!(t.contains("cat shared.txt: base | wip line"), "{t}");
        assert!(t.contains("cat staged.txt: staged"), "{t}");
        assert!(t.contains("cat untracked.txt: untracked"), "{t}");
        assert!(
            t.contains("(missing ignored.txt)"),
            "ignored files stay out: {t}"
        );
    }
    assert!(
        text(2).contains("(missing untracked.txt)"),
        "without include_wip the worktree is HEAD: {}",
        text(2)
    );
    let patch = patch_of(&s, &run, "edit");
    assert!(patch.contains("+agent"), "{patch}");
    assert!(
        !patch.contains("wip line"),
        "the patch is the agent's change only: {patch}"
    );
    assert!(!patch.contains("staged"), "{patch}");
    assert_eq!(git(&repo, &["status", "--porcelain"]), status_before);
}

/// A batch for the crash tests: two tasks that write, one that does not; each answers into an
/// artifact; `extra` args go to every task.
fn crash_batch(s: &Scratch, repo: &Path, extra: &[&'static str]) -> String {
    let with = |mut v: Vec<&'static str>| {
        v.extend_from_slice(extra);
        v
    };
    // Unsupervised: these crashes test the orphan path (the attempt dies with sortie, resume
    // retries it in the same worktree); supervised attempts are adopted (tests/e2e/supervised.rs).
    let out = |l: &str| format!("output = \"out/{l}.txt\"\nsupervise = false");
    let tasks: Vec<Task<'_>> = vec![
        ("a", with(vec!["--write", "shared.txt:from a"]), out("a")),
        ("b", with(vec!["--write", "new.txt:from b"]), out("b")),
        ("idle", with(vec![]), out("idle")),
    ];
    batch(s, repo, 3, &tasks)
}

fn resume_to_end(s: &Scratch, run: &str) {
    let out = s.run(&["resume", run]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_crash_outcome(s: &Scratch, run: &str, repo: &Path, what: &str) {
    let fates = assert_matches_journal(s, run, repo);
    assert!(
        fates["a"].changed && fates["b"].changed,
        "{what}: {fates:?}"
    );
    assert!(!fates["idle"].changed, "{what}");
    assert_eq!(
        std::fs::read_to_string(Path::new(&fates["a"].path).join("shared.txt")).expect("read"),
        "base\nfrom a\n",
        "{what}: a's change, once"
    );
    assert!(patch_of(s, run, "b").contains("+from b"), "{what}");
    let events = s.events(run);
    for i in 0..3 {
        let finished = events.of(i, "TaskFinished");
        assert_eq!(
            finished[0]["result"]["state"], "completed",
            "{what}: task {i}"
        );
    }
}

/// SIGKILL right after `WorktreePlanned` (the worktree may not exist yet) and right after
/// `TaskSetUp` (it exists, nothing ran): resume creates or reuses it from the journal, runs
/// each task once, and git ends up exactly as the journal says.
#[test]
fn sigkill_during_setup_then_resume() {
    for pause in ["WorktreePlanned", "TaskSetUp"] {
        let s = Scratch::new();
        let repo = repo(&s);
        let file = crash_batch(&s, &repo, &[]);
        let run = unique_run("wt-setup");
        let mut child = start(&s, &["run", "--run-id", &run, &file], Some(pause));
        poll(pause, 60, || {
            (!exited(&mut child, &s, &run) && has_event(&s, &run, pause)).then_some(())
        });
        kill9(child);
        let at_kill = s.events(&run);
        assert_eq!(
            at_kill.count("AttemptLaunching"),
            0,
            "killed during setup, after {pause}"
        );
        resume_to_end(&s, &run);
        assert_crash_outcome(&s, &run, &repo, pause);
        let events = s.events(&run);
        for i in 0..3 {
            assert_eq!(
                events.of(i, "AttemptLaunching").len(),
                1,
                "{pause}: task {i} ran once"
            );
        }
    }
}

/// SIGKILL while the attempts run: resume kills them, retries them in the same worktrees, and
/// finalizes; the kept worktree holds the retry's change once.
#[test]
fn sigkill_mid_attempt_then_resume() {
    let s = Scratch::new();
    let repo = repo(&s);
    let file = crash_batch(
        &s,
        &repo,
        &[
            "--attempt",
            "{attempt}",
            "--sleep",
            "60",
            "--sleep-attempts",
            "1",
        ],
    );
    let run = unique_run("wt-attempt");
    let child = start(&s, &["run", "--run-id", &run, &file], None);
    poll("three attempts started", 60, || {
        let events = s.try_events(&run)?;
        (events.count("AttemptStarted") == 3).then_some(())
    });
    kill9(child);
    resume_to_end(&s, &run);
    assert_crash_outcome(&s, &run, &repo, "mid-attempt");
    let events = s.events(&run);
    for i in 0..3 {
        assert_eq!(events.of(i, "AttemptOrphaned").len(), 1);
        assert_eq!(events.of(i, "WorktreePlanned").len(), 1);
    }
}

/// SIGKILL between the artifact and the worktree's finalize, and inside a finalize (its work
/// done, its event not yet recorded: the unchanged worktree already removed, or the changed
/// one's patch already written): resume finishes each finalize once, without running anything
/// again, and git matches the journal.
#[test]
fn sigkill_mid_finalize_then_resume() {
    for (pause, only) in [
        ("ArtifactWritten", "idle"),
        ("ArtifactWritten", "a"),
        ("before:WorktreeFinalized", "idle"),
        ("before:WorktreeFinalized", "a"),
    ] {
        let s = Scratch::new();
        let repo = repo(&s);
        let file = crash_batch(&s, &repo, &[]);
        // One task, so that the pause is that task's and no other attempt is cut short.
        let text = std::fs::read_to_string(&file).expect("read");
        let keep: Vec<&str> = text
            .split("\n[[tasks]]\n")
            .filter(|b| !b.starts_with("label") || b.contains(&format!("\"{only}\"")))
            .collect();
        let file = s
            .write("batch.toml", &keep.join("\n[[tasks]]\n"))
            .display()
            .to_string();
        let run = unique_run("wt-final");
        let mut child = start(&s, &["run", "--run-id", &run, &file], Some(pause));
        let state_dir = s.state_dir();
        poll(pause, 60, || match (pause, only) {
            _ if exited(&mut child, &s, &run) => None,
            ("ArtifactWritten", _) => has_event(&s, &run, pause).then_some(()),
            (_, "idle") => {
                let gone = !state_dir.join("worktrees").join(&run).join("idle").exists();
                let branch = sortie_branches(&repo).is_empty();
                (has_event(&s, &run, "ArtifactWritten") && gone && branch).then_some(())
            }
            (_, label) => state_dir
                .join("runs")
                .join(&run)
                .join("patches")
                .join(format!("{label}.patch"))
                .exists()
                .then_some(()),
        });
        // The finalize's event is not in the journal: the kill falls inside the step. The
        // journal is read after the kill, so it is exactly what the kill left, and the check
        // holds whatever the timing. The sleep only lets the finalize job reach the pause (its
        // work done) rather than be cut short a little earlier: either moment is inside the
        // step, which the resume must finish, so a slow machine cannot make this pass without
        // checking what it says.
        std::thread::sleep(std::time::Duration::from_millis(300));
        kill9(child);
        let at_kill = s.events(&run);
        assert_eq!(at_kill.count("WorktreeFinalized"), 0, "{pause} {only}");
        resume_to_end(&s, &run);
        let events = s.events(&run);
        let labels = crate::support::labels(&events);
        let fates = assert_matches_journal(&s, &run, &repo);
        for (i, label) in labels.iter().enumerate() {
            assert_eq!(
                events.of(i as u64, "AttemptLaunching").len(),
                1,
                "{pause}: {label} is not run again"
            );
            assert_eq!(events.of(i as u64, "ArtifactWritten").len(), 1);
            assert_eq!(fates[label].changed, label != "idle", "{pause}: {label}");
        }
    }
}

/// `sortie cancel` of a live run finalizes the worktrees of the tasks it stops: a cancelled
/// task's change is kept, an unchanged one is removed. fail_fast ends a task that had a
/// worktree (its retry is not launched) after finalizing it, keeps the failed task's change, and
/// a task that never started has no worktree.
#[test]
fn cancel_and_fail_fast_finalize_worktrees() {
    // Cancel.
    let s = Scratch::new();
    let repo = repo(&s);
    let tasks: Vec<Task<'_>> = vec![
        (
            "early",
            vec!["--write-first", "shared.txt:early", "--sleep", "60"],
            String::new(),
        ),
        ("quiet", vec!["--sleep", "60"], String::new()),
    ];
    let file = batch(&s, &repo, 2, &tasks);
    let run = unique_run("wt-cancel");
    let child = start(&s, &["run", "--run-id", &run, &file], None);
    let early = s.state_dir().join("worktrees").join(&run).join("early");
    poll("both attempts started and early wrote", 60, || {
        let events = s.try_events(&run)?;
        let wrote =
            std::fs::read_to_string(early.join("shared.txt")).is_ok_and(|t| t.contains("early"));
        (events.count("AttemptStarted") == 2 && wrote).then_some(())
    });
    let out = s.run(&["cancel", &run]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "cancel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::support::finish(child, 60);
    let fates = assert_matches_journal(&s, &run, &repo);
    assert!(fates["early"].changed, "a cancelled task's change is kept");
    assert!(!fates["quiet"].changed);
    let events = s.events(&run);
    for i in 0..2 {
        assert_eq!(
            events.of(i, "TaskFinished")[0]["result"]["state"],
            "cancelled"
        );
    }

    // fail_fast.
    let s = Scratch::new();
    let repo = self::repo(&s);
    let tasks: Vec<Task<'_>> = vec![
        (
            "flaky",
            vec![
                "--attempt",
                "{attempt}",
                "--sleep",
                "1",
                "--fail-attempts",
                "1:error",
            ],
            String::new(),
        ),
        (
            "bad",
            vec!["--write", "shared.txt:bad", "--exit", "1"],
            String::new(),
        ),
        ("later", vec![], String::new()),
    ];
    let file = batch(&s, &repo, 2, &tasks);
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("fail_fast = true\n{text}")).expect("write");
    let run = unique_run("wt-failfast");
    let out = s.run(&["run", "--run-id", &run, &file]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fates = assert_matches_journal(&s, &run, &repo);
    assert!(fates["bad"].changed, "the failed task's change is kept");
    assert!(
        !fates["flaky"].changed,
        "the cancelled retry's worktree is removed"
    );
    assert!(!fates.contains_key("later"), "never set up");
    let events = s.events(&run);
    let state = |i: usize| events.of(i as u64, "TaskFinished")[0]["result"]["state"].clone();
    assert_eq!(state(0), "cancelled");
    assert_eq!(state(1), "failed");
    assert_eq!(state(2), "cancelled");
    assert_eq!(events.of(0, "AttemptLaunching").len(), 1);
}
