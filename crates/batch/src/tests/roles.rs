//! The batch loader's tests of roles and sessions (#13): a role's fields under the task's own
//! and over `[defaults]`, the first folder holding the role file winning over the built-ins,
//! an unknown role and a malformed role file named with file and line, and sessions refused
//! where they cannot be a conversation.

use std::path::Path;

use sortie_core::Permissions;

use crate::*;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_role_gives_what_the_task_does_not_and_beats_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        &d.join(".claude/agents/reviewer.md"),
        "---\nname: reviewer\ndescription: Reviews\nmodel: sonnet\ntools: Read, Grep\n\
         permissions: read-only\n---\nYou review.\n",
    );
    // .sortie/agents is looked at first.
    write(
        &d.join(".sortie/agents/fixer.md"),
        "---\npermissions: full\nthinking: high\n---\nYou fix.\n",
    );
    write(
        &d.join(".claude/agents/fixer.md"),
        "---\nmodel: never\n---\n",
    );
    let path = d.join("b.toml");
    write(
        &path,
        "allow_shared_writes = true\n[defaults]\nagent = \"claude\"\nmodel = \"opus\"\npermissions = \"edit\"\n\
         system_prompt = \"Default words.\"\nrole = \"scout\"\n\n\
         [[tasks]]\nlabel = \"r\"\nrole = \"reviewer\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"own\"\nrole = \"reviewer\"\npermissions = \"edit\"\n\
         model = \"haiku\"\nsystem_prompt = \"Mine.\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"f\"\nrole = \"fixer\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"s\"\nprompt = \"p\"\n",
    );
    let loaded = load(&path, None, &Overrides::default()).unwrap();
    let t = &loaded.batch.tasks;
    assert_eq!(t[0].role.as_deref(), Some("reviewer"));
    assert_eq!(
        t[0].model.as_deref(),
        Some("sonnet"),
        "the role over [defaults]"
    );
    assert_eq!(t[0].permissions, Permissions::ReadOnly);
    assert_eq!(t[0].tools, ["Read", "Grep"]);
    assert_eq!(t[0].system_prompt.as_deref(), Some("You review."));
    // The task's own fields win; its system prompt follows the role's.
    assert_eq!(t[1].model.as_deref(), Some("haiku"));
    assert_eq!(t[1].permissions, Permissions::Edit);
    assert_eq!(t[1].system_prompt.as_deref(), Some("You review.\n\nMine."));
    assert_eq!(t[2].permissions, Permissions::Full);
    assert_eq!(t[2].thinking.as_deref(), Some("high"));
    assert_eq!(
        t[2].model.as_deref(),
        Some("opus"),
        "not the later folder's file"
    );
    // [defaults]' role: the built-in scout.
    assert_eq!(t[3].role.as_deref(), Some("scout"));
    assert_eq!(t[3].permissions, Permissions::ReadOnly);
    assert!(
        t[3].system_prompt
            .as_deref()
            .unwrap()
            .starts_with("You are a scout."),
        "{:?}",
        t[3].system_prompt
    );

    let checked = load_for_check(&path, None, &Overrides::default()).unwrap();
    let uses: Vec<(String, Option<std::path::PathBuf>, Vec<String>)> = checked
        .roles()
        .iter()
        .map(|r| (r.name.clone(), r.file.clone(), r.tasks.clone()))
        .collect();
    assert_eq!(
        uses,
        [
            (
                "fixer".into(),
                Some(d.join(".sortie/agents/fixer.md")),
                vec!["f".into()]
            ),
            (
                "reviewer".into(),
                Some(d.join(".claude/agents/reviewer.md")),
                vec!["r".into(), "own".into()]
            ),
            ("scout".into(), None, vec!["s".into()]),
        ]
    );
}

#[test]
fn an_unknown_role_and_a_malformed_role_file_are_named_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let role = d.join(".pi/agents/bad.md");
    write(&role, "---\nmodel: m\npermissions: sometimes\n---\nbody\n");
    let path = d.join("b.toml");
    write(
        &path,
        "[[tasks]]\nlabel = \"a\"\nrole = \"nobody\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"b\"\nrole = \"bad\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"c\"\nrole = \"../x\"\nprompt = \"p\"\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let found: Vec<(std::path::PathBuf, Option<usize>, Option<String>)> = err
        .issues()
        .iter()
        .map(|i| (i.file.clone(), i.line, i.field.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (path.clone(), Some(3), Some("role".into())),
            (path.clone(), Some(13), Some("role".into())),
            (role.clone(), Some(3), Some("permissions".into())),
        ],
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("unknown role \"nobody\": no nobody.md in ")
            && text.contains(".sortie/agents")
            && text.contains("the built-in roles: scout, coder, reviewer"),
        "{text}"
    );
    assert!(
        text.contains("bad.md:3: field `permissions`: expected"),
        "{text}"
    );
}

#[test]
fn a_session_is_refused_where_it_cannot_be_one_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.toml");
    write(
        &path,
        "[defaults]\nsession = \"all\"\n\n\
         [[tasks]]\nlabel = \"a\"\nagent = \"claude\"\nsession = \"s\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"b\"\nagent = \"codex\"\nsession = \"s\"\nprompt = \"p\"\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let found: Vec<(Option<usize>, Option<String>)> = err
        .issues()
        .iter()
        .map(|i| (i.line, i.field.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (Some(2), Some("session".into())),
            (Some(13), Some("session".into()))
        ],
        "{err}"
    );
    assert!(err.to_string().contains("another agent's session"), "{err}");

    // A valid session: the spec names it.
    write(
        &path,
        "[[tasks]]\nlabel = \"a\"\nagent = \"claude\"\nsession = \"s\"\nprompt = \"p\"\n\n\
         [[tasks]]\nlabel = \"b\"\nagent = \"claude\"\nsession = \"s\"\nprompt = \"p\"\n",
    );
    let loaded = load(&path, None, &Overrides::default()).unwrap();
    assert_eq!(loaded.batch.tasks[1].session.as_deref(), Some("s"));
}
