//! End-to-end test of secrets by reference (#34): a plain command given `OPENAI_API_KEY` by
//! `from_env` and by `from_file` prints it; `sortie logs`, the export, the HTML report and the
//! artifact show `[redacted:OPENAI_API_KEY]` and never the value, and no byte of the state dir
//! holds it. A reference that cannot be read fails its task at once, naming the variable.

use std::path::Path;

use crate::support::{Scratch, unique_run};

/// The secret given by the environment.
const FROM_ENV: &str = "sk-e2e-env-0123456789abcdefghijklmnopqrstuv";
/// The secret given by a file (written with a trailing newline, which is trimmed).
const FROM_FILE: &str = "sk-e2e-file-9876543210zyxwvutsrqponmlkjihg";

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_secret_given_by_reference_is_redacted_everywhere_the_run_keeps_it() {
    let s = Scratch::new();
    let run = &unique_run("secrets");
    let key_file = s.write("openai", &format!("{FROM_FILE}\n"));
    let echo = r#"command = ["sh", "-c", "echo \"key is $OPENAI_API_KEY\""]"#;
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"by-env\"\n{echo}\noutput = \"out-env.md\"\n\
             env = {{ OPENAI_API_KEY = {{ from_env = \"SORTIE_E2E_SECRET\" }} }}\n\n\
             [[tasks]]\nlabel = \"by-file\"\n{echo}\noutput = \"out-file.md\"\n\
             env = {{ OPENAI_API_KEY = {{ from_file = \"{}\" }} }}\n\n\
             [[tasks]]\nlabel = \"missing\"\n{echo}\n\
             env = {{ OPENAI_API_KEY = {{ from_env = \"SORTIE_E2E_SURELY_UNSET\" }} }}\n",
            key_file.display()
        ),
    );
    let out = s
        .sortie()
        .env("SORTIE_E2E_SECRET", FROM_ENV)
        .env_remove("SORTIE_E2E_SURELY_UNSET")
        .args(["--quiet", "run", "--run-id", run])
        .arg(&batch)
        .output()
        .expect("run sortie");
    // The missing reference fails its task: the run is partial.
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    let status = s.status(run);
    let view = crate::support::task_view(&status, "missing");
    let text = view.to_string();
    assert!(
        text.contains("SORTIE_E2E_SURELY_UNSET") && text.contains("OPENAI_API_KEY"),
        "the failure names the variable: {text}"
    );

    for (label, artifact) in [("by-env", "out-env.md"), ("by-file", "out-file.md")] {
        // `logs` runs without the secret in its environment: the file itself is masked.
        let logs = s.run_ok(&["logs", run, label]);
        let logs = String::from_utf8_lossy(&logs.stdout);
        assert_eq!(
            logs.trim_end(),
            "key is [redacted:OPENAI_API_KEY]",
            "{label}"
        );
        let art = std::fs::read_to_string(s.path().join(artifact)).expect("artifact");
        assert!(art.contains("[redacted:OPENAI_API_KEY]"), "{label}: {art}");
        assert!(!art.contains(FROM_ENV) && !art.contains(FROM_FILE), "{art}");
    }

    let export = s.run_ok(&["export", run]);
    let export = String::from_utf8_lossy(&export.stdout);
    assert!(export.contains("[redacted:OPENAI_API_KEY]"), "{export}");
    let html = s.path().join("report.html");
    s.run_ok(&["report", run, "--html", &html.display().to_string()]);
    let html = std::fs::read_to_string(&html).expect("the report");
    for secret in [FROM_ENV, FROM_FILE] {
        assert!(!export.contains(secret), "the export holds a secret");
        assert!(!html.contains(secret), "the report holds a secret");
        assert_eq!(
            files_holding(&s.state_dir(), secret.as_bytes()),
            Vec::<String>::new(),
            "no file of the state dir holds a secret"
        );
    }
    // env.json holds the references, not their values.
    let env = std::fs::read_to_string(s.state_dir().join("runs").join(run).join("env.json"))
        .expect("env.json");
    assert!(
        env.contains("SORTIE_E2E_SECRET") && env.contains("from_file"),
        "{env}"
    );
}

/// `sortie check` names a reference that cannot be read at its `env` line, and a malformed one.
#[test]
fn check_names_a_reference_that_cannot_be_read_at_its_line() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\n\
         env = { K = { from_env = \"SORTIE_E2E_SURELY_UNSET\" } }\n\n\
         [[tasks]]\nlabel = \"b\"\ncommand = [\"true\"]\n\
         env = { K = { from_file = \"/nonexistent/sortie-34/key\" }, L = { frm = \"x\" } }\n",
    );
    let out = s
        .sortie()
        .env_remove("SORTIE_E2E_SURELY_UNSET")
        .arg("check")
        .arg(&batch)
        .output()
        .expect("run sortie");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("batch.toml:4: field `env`")
            && text.contains("SORTIE_E2E_SURELY_UNSET (`from_env`) is not set"),
        "{text}"
    );
    assert!(
        text.contains("batch.toml:9: field `env`")
            && text.contains("cannot read /nonexistent/sortie-34/key"),
        "{text}"
    );
    assert!(text.contains("batch.toml:9: field `env.L`"), "{text}");
}
