//! The batch loader's tests of `needs` patterns and `needs_mode` (#33, a judge over samples):
//! a pattern resolves to the labels it matches (templates expanded), never the task itself; a
//! pattern that matches no task is an error at its file and line, for `run` and `check` alike.

use sortie_core::NeedsMode;

use crate::*;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn needs_of(b: &LoadedBatch, label: &str) -> Vec<String> {
    b.batch
        .tasks
        .iter()
        .find(|t| t.label == label)
        .map(|t| t.needs.clone())
        .unwrap_or_else(|| panic!("no task {label}"))
}

#[test]
fn a_pattern_resolves_to_the_labels_it_matches_in_batch_order_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[defaults]\nneeds_mode = \"settled\"\n\n\
         [[tasks]]\nlabel = \"s-{sample}\"\ncommand = [\"true\"]\ncount = 3\nneeds_mode = \"completed\"\n\n\
         [[tasks]]\nlabel = \"s-10\"\ncommand = [\"true\"]\nneeds_mode = \"completed\"\n\n\
         [[tasks]]\nlabel = \"judge\"\ncommand = [\"true\"]\nneeds = [\"s-*\"]\n\n\
         [[tasks]]\nlabel = \"pick\"\ncommand = [\"true\"]\nneeds = [\"s-?\", \"s-2\", \"judge\"]\n",
    );
    let b = load(&path, None, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(needs_of(&b, "judge"), ["s-1", "s-2", "s-3", "s-10"]);
    // `s-2` is named as well: it stays where it was named, once.
    assert_eq!(needs_of(&b, "pick"), ["s-1", "s-3", "s-2", "judge"]);
    let modes: Vec<(&str, NeedsMode)> = b
        .batch
        .tasks
        .iter()
        .map(|t| (t.label.as_str(), t.needs_mode))
        .collect();
    assert_eq!(
        modes,
        [
            ("s-1", NeedsMode::Completed),
            ("s-2", NeedsMode::Completed),
            ("s-3", NeedsMode::Completed),
            ("s-10", NeedsMode::Completed),
            ("judge", NeedsMode::Settled),
            ("pick", NeedsMode::Settled),
        ],
        "a task's own needs_mode wins over [defaults]'"
    );
}

#[test]
fn a_pattern_that_matches_no_task_is_an_error_at_the_line_of_its_needs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[[tasks]]\nlabel = \"build\"\ncommand = [\"true\"]\n\n\
         [[tasks]]\nlabel = \"judge\"\ncommand = [\"true\"]\nneeds = [\"build\", \"fix-*\"]\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.issues().len(), 1, "{text}");
    assert!(
        text.contains("b.toml:8: field `needs`: the pattern \"fix-*\" matches no task"),
        "{text}"
    );

    // `sortie check` says the same, at the same place.
    let checked = load_for_check(&path, None, &Overrides::default()).unwrap();
    let said: Vec<String> = checked.issues().iter().map(|i| i.to_string()).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].ends_with("b.toml:8: field `needs`: the pattern \"fix-*\" matches no task"),
        "{said:?}"
    );
}

#[test]
fn a_pattern_in_defaults_that_matches_nothing_is_reported_once_at_the_defaults_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[defaults]\nneeds = [\"prep-?\"]\n\n\
         [[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\n\n\
         [[tasks]]\nlabel = \"b-{sample}\"\ncommand = [\"true\"]\ncount = 2\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.issues().len(), 1, "{text}");
    assert!(
        text.contains("b.toml:2: field `needs`: the pattern \"prep-?\" matches no task"),
        "{text}"
    );
}

#[test]
fn a_pattern_never_matches_the_task_itself() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[[tasks]]\nlabel = \"run-a\"\ncommand = [\"true\"]\nneeds = [\"run-*\"]\n\n\
         [[tasks]]\nlabel = \"run-b\"\ncommand = [\"true\"]\n",
    );
    let b = load(&path, None, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(needs_of(&b, "run-a"), ["run-b"]);

    // Matching only itself is matching nothing.
    let alone = write(
        dir.path(),
        "alone.toml",
        "[[tasks]]\nlabel = \"other\"\ncommand = [\"true\"]\n\n\
         [[tasks]]\nlabel = \"run-a\"\ncommand = [\"true\"]\nneeds = [\"run-*\"]\n",
    );
    let text = load(&alone, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("alone.toml:8: field `needs`: the pattern \"run-*\" matches no task"),
        "{text}"
    );
}

#[test]
fn a_pattern_over_a_template_and_itself_is_a_cycle_as_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[[tasks]]\nlabel = \"s-{sample}\"\ncommand = [\"true\"]\ncount = 2\nneeds = [\"s-*\"]\n",
    );
    let text = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(text.contains("dependency cycle"), "{text}");
}

#[test]
fn needs_mode_takes_completed_or_settled() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "b.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\nneeds_mode = \"all\"\n",
    );
    let text = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(
            "b.toml:4: field `needs_mode`: expected \"completed\" or \"settled\", found \"all\""
        ),
        "{text}"
    );
}

#[test]
fn a_role_may_give_needs_mode_under_the_tasks_own_and_over_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".sortie/agents")).unwrap();
    write(
        &dir.path().join(".sortie/agents"),
        "judge.md",
        "---\nname: judge\nneeds_mode: settled\n---\nYou judge attempts.\n",
    );
    write(
        &dir.path().join(".sortie/agents"),
        "sloppy.md",
        "---\nneeds_mode: whenever\n---\n",
    );
    let path = write(
        dir.path(),
        "b.toml",
        "allow_shared_writes = true\n[defaults]\nneeds_mode = \"completed\"\n\n\
         [[tasks]]\nlabel = \"s-{sample}\"\ncommand = [\"true\"]\ncount = 2\n\n\
         [[tasks]]\nlabel = \"judge\"\nrole = \"judge\"\nprompt = \"judge\"\nneeds = [\"s-*\"]\n\n\
         [[tasks]]\nlabel = \"strict\"\nrole = \"judge\"\nprompt = \"judge\"\nneeds = [\"s-*\"]\n\
         needs_mode = \"completed\"\n",
    );
    let b = load(&path, None, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    let mode = |label: &str| {
        b.batch
            .tasks
            .iter()
            .find(|t| t.label == label)
            .map(|t| t.needs_mode)
    };
    assert_eq!(mode("judge"), Some(NeedsMode::Settled), "the role's");
    assert_eq!(mode("strict"), Some(NeedsMode::Completed), "the task's own");
    assert_eq!(mode("s-1"), Some(NeedsMode::Completed), "[defaults]'");

    let bad = write(
        dir.path(),
        "bad.toml",
        "[[tasks]]\nlabel = \"a\"\nprompt = \"p\"\nrole = \"sloppy\"\n",
    );
    let text = load(&bad, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(
            "sloppy.md:2: field `needs_mode`: expected \"completed\" or \"settled\", found \"whenever\""
        ),
        "{text}"
    );
}

#[test]
fn patterns_that_stand_for_too_many_dependencies_are_refused_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    // 1001 tasks, each needing every other: a million dependencies and more.
    let path = write(
        dir.path(),
        "b.toml",
        "[defaults]\nneeds = [\"s-*\"]\n\n\
         [[tasks]]\nlabel = \"s-{sample}\"\ncommand = [\"true\"]\ncount = 1001\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "b.toml:2: field `needs`: the batch's `needs` patterns stand for 1002001 dependencies \
             in all, more than 1000000"
        ),
        "{text}"
    );
}
