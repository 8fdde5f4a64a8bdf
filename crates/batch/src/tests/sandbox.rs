//! #34: where a task's `sandbox` comes from: the task's own, a role's, `[defaults]`', the
//! profile's (`[agents.NAME] sandbox`), else the built-in rule (a built-in agent profile is
//! sandboxed, a task's own command and a profile of the file's own are not).

use std::path::Path;

use sortie_core::sandbox::Sandbox;

use crate::*;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn modes(dir: &Path, text: &str) -> Vec<(String, Sandbox)> {
    let path = dir.join("b.toml");
    write(&path, text);
    let loaded = load(&path, None, &Overrides::default()).unwrap();
    loaded
        .batch
        .tasks
        .iter()
        .map(|t| (t.label.clone(), t.sandbox))
        .collect()
}

#[test]
fn built_in_agents_are_sandboxed_and_commands_are_not_unless_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let got = modes(
        dir.path(),
        "allow_shared_writes = true\n\
         [agents.mine]\ncommand = [\"my-agent\"]\nprotocol = \"claude-stream-json\"\n\n\
         [[tasks]]\nlabel = \"pi\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"claude\"\nagent = \"claude\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"codex\"\nagent = \"codex\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"rpc\"\nagent = \"pi-rpc\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"cmd\"\ncommand = [\"true\"]\n\n\
         [[tasks]]\nlabel = \"cmd-in\"\ncommand = [\"true\"]\nsandbox = \"workspace\"\n\n\
         [[tasks]]\nlabel = \"mine\"\nagent = \"mine\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"out\"\nagent = \"codex\"\nprompt = \"p\"\nsandbox = \"off\"\n",
    );
    let want = [
        ("pi", Sandbox::Workspace),
        ("claude", Sandbox::Workspace),
        ("codex", Sandbox::Off),
        ("rpc", Sandbox::Workspace),
        ("cmd", Sandbox::Off),
        ("cmd-in", Sandbox::Workspace),
        ("mine", Sandbox::Off),
        ("out", Sandbox::Off),
    ];
    let want: Vec<(String, Sandbox)> = want.iter().map(|(l, m)| ((*l).into(), *m)).collect();
    assert_eq!(got, want);
}

#[test]
fn the_task_beats_a_role_which_beats_defaults_which_beat_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        &d.join(".sortie/agents/free.md"),
        "---\nsandbox: off\n---\nYou are free.\n",
    );
    write(
        &d.join(".sortie/agents/boxed.md"),
        "---\nsandbox: workspace\n---\nYou are boxed.\n",
    );
    let got = modes(
        d,
        "allow_shared_writes = true\n\
         [agents.claude]\nsandbox = \"off\"\n\
         [agents.mine]\ncommand = [\"my-agent\"]\nsandbox = \"workspace\"\n\n\
         [[tasks]]\nlabel = \"profile-off\"\nagent = \"claude\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"profile-on\"\nagent = \"mine\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"role-off\"\nagent = \"pi\"\nrole = \"free\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"role-on\"\nagent = \"claude\"\nrole = \"boxed\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"task-on\"\nagent = \"pi\"\nrole = \"free\"\nprompt = \"p\"\n\
         sandbox = \"workspace\"\n",
    );
    let want = [
        ("profile-off", Sandbox::Off),
        ("profile-on", Sandbox::Workspace),
        ("role-off", Sandbox::Off),
        ("role-on", Sandbox::Workspace),
        ("task-on", Sandbox::Workspace),
    ];
    let want: Vec<(String, Sandbox)> = want.iter().map(|(l, m)| ((*l).into(), *m)).collect();
    assert_eq!(got, want);
    let defaults = modes(
        d,
        "allow_shared_writes = true\n[defaults]\nsandbox = \"off\"\n\
         [agents.mine]\ncommand = [\"my-agent\"]\nsandbox = \"workspace\"\n\n\
         [[tasks]]\nlabel = \"a\"\nagent = \"pi\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"b\"\nagent = \"mine\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"c\"\nagent = \"pi\"\nrole = \"boxed\"\nprompt = \"p\"\n",
    );
    let modes: Vec<Sandbox> = defaults.into_iter().map(|(_, m)| m).collect();
    assert_eq!(modes, [Sandbox::Off, Sandbox::Off, Sandbox::Workspace]);
}

#[test]
fn a_bad_sandbox_in_a_profile_or_a_role_is_an_error_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = d.join("bad.toml");
    write(
        &path,
        "[agents.pi]\nsandbox = \"tight\"\n\n[[tasks]]\nprompt = \"p\"\n",
    );
    let err = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":2") && err.contains("agents.pi.sandbox"),
        "{err}"
    );
    write(&d.join(".sortie/agents/r.md"), "---\nsandbox: tight\n---\n");
    write(&path, "[[tasks]]\nprompt = \"p\"\nrole = \"r\"\n");
    let err = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("r.md:2") && err.contains("\"workspace\""),
        "{err}"
    );
}
