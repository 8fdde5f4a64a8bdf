//! Structured results (issue 13) without any agent CLI: plain commands print their result on
//! stdout and get no repair round; a plain-protocol profile that echoes its prompt shows the
//! contract sortie adds and `{outputs.LABEL.json}`; `status --json` and `sortie results`
//! (table, `--json`, `--jsonl`) show the validated values; a schema that does not compile is a
//! batch error at its file and line, and nothing runs. (The repair round with the real Claude
//! Code, pi and Codex is in `real_structured.rs`.)

use serde_json::{Value, json};

use crate::support::{Scratch, task_view};
use sortie_testkit::Events;

const SCHEMA: &str =
    r#"{"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}"#;

#[test]
fn plain_results_are_validated_without_repair_chained_as_json_and_listed_for_scoring() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path().join("schemas")).expect("mkdir");
    s.write("schemas/answer.json", SCHEMA);
    let script = s.write(
        "good.sh",
        "echo 'thinking...'\nprintf '```json\\n{\"answer\": 7}\\n```\\n'\n",
    );
    let schema = "output_schema = \"schemas/answer.json\"";
    let batch = s.write(
        "batch.toml",
        &format!(
            "allow_shared_writes = true\n\n\
             [agents.echo]\ncommand = [\"printf\", \"%s\", \"{{prompt}}\"]\nprotocol = \"plain\"\n\n\
             [defaults]\nmax_retries = 2\n\n\
             [[tasks]]\nlabel = \"good\"\n{schema}\ncommand = [\"sh\", {script:?}]\n\n\
             [[tasks]]\nlabel = \"whole\"\n{schema}\ncommand = [\"echo\", \"{{\\\"answer\\\": 8}}\"]\n\n\
             [[tasks]]\nlabel = \"wrong\"\n{schema}\n\
             command = [\"echo\", \"{{\\\"answer\\\": \\\"seven\\\"}}\"]\n\n\
             [[tasks]]\nlabel = \"none\"\n{schema}\ncommand = [\"echo\", \"no JSON here\"]\n\n\
             [[tasks]]\nlabel = \"asks\"\n{schema}\nagent = \"echo\"\nprompt = \"Count.\"\n\n\
             [[tasks]]\nlabel = \"uses\"\nagent = \"echo\"\nneeds = [\"good\", \"whole\"]\n\
             prompt = \"good={{outputs.good.json}} whole={{outputs.whole.json}}\"\n"
        ),
    );
    let run = "structured-plain";
    let out = s.run(&["--quiet", "run", "--run-id", run, batch.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "partial tasks: {stderr}");
    let events = s.events(run);
    let finished = |task: usize| -> Vec<Value> {
        events
            .of(task as u64, "AttemptFinished")
            .into_iter()
            .cloned()
            .collect()
    };

    // The last JSON block of stdout, or stdout itself when it is one JSON value.
    for (task, value) in [(0, r#"{"answer":7}"#), (1, r#"{"answer":8}"#)] {
        let f = finished(task);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0]["outcome"]["status"], "completed", "{f:?}");
        assert_eq!(f[0]["outcome"]["result"], value, "journaled as JSON text");
    }
    // A mismatch, or no JSON at all: partial at once (no repair round, no retry), saying why.
    let wrong = finished(2);
    assert_eq!(wrong.len(), 1, "a wrong result is not retried: {wrong:?}");
    assert_eq!(wrong[0]["outcome"]["status"], "partial");
    let error = wrong[0]["outcome"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("structured result: the result does not match the schema: at /answer: ")
            && error.contains("\"seven\" is not of type \"integer\""),
        "{error}"
    );
    assert_eq!(wrong[0]["outcome"]["result"], Value::Null);
    let none = finished(3);
    assert_eq!(none[0]["outcome"]["status"], "partial");
    assert!(
        none[0]["outcome"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("no ```json:result block")),
        "{none:?}"
    );

    // The contract reaches the agent with its prompt: the schema and how to answer.
    let asks = finished(4);
    let prompt = asks[0]["output"].as_str().unwrap_or_default();
    assert!(
        prompt.starts_with("Count.\n\n---\nStructured result:"),
        "{prompt}"
    );
    assert!(
        prompt.contains("fenced block tagged `json:result`"),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            r#"{"properties":{"answer":{"type":"integer"}},"required":["answer"],"type":"object"}"#
        ),
        "{prompt}"
    );
    // {outputs.LABEL.json}: the validated values, as compact JSON.
    let uses = finished(5);
    let text = uses[0]["output"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(r#"good={"answer":7} whole={"answer":8}"#),
        "{text}"
    );

    // status --json: the value, parsed.
    let status = s.status(run);
    assert_eq!(task_view(&status, "good")["result"], json!({"answer": 7}));
    assert_eq!(task_view(&status, "wrong")["result"], Value::Null);
    assert_eq!(task_view(&status, "wrong")["state"], "partial");

    // sortie results: one record per task, in batch order.
    let jsonl = s.run_ok(&["results", run, "--jsonl"]);
    let records: Vec<Value> = String::from_utf8_lossy(&jsonl.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let labels: Vec<&str> = records.iter().filter_map(|r| r["label"].as_str()).collect();
    assert_eq!(labels, ["good", "whole", "wrong", "none", "asks", "uses"]);
    assert_eq!(records[0]["state"], "completed");
    assert_eq!(records[0]["value"], json!({"answer": 7}));
    assert_eq!(records[1]["value"], json!({"answer": 8}));
    assert_eq!(records[2]["state"], "partial");
    assert_eq!(records[2]["value"], Value::Null);
    assert!(
        records[2]["error"]
            .as_str()
            .is_some_and(|e| e.contains("/answer"))
    );
    assert!(records[0]["usage"]["input"].is_u64(), "{:?}", records[0]);
    let array: Value =
        serde_json::from_slice(&s.run_ok(&["--json", "results", run]).stdout).expect("JSON");
    assert_eq!(array.as_array().map(Vec::len), Some(6));
    assert_eq!(
        array[1], records[1],
        "--json and --jsonl print the same records"
    );
    let table = s.run_ok(&["results", run]);
    let table = String::from_utf8_lossy(&table.stdout);
    let line = |label: &str| {
        table
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label}:\n{table}"))
            .to_owned()
    };
    assert!(line("good ").ends_with(r#"{"answer":7}"#), "{table}");
    assert!(line("wrong ").contains("partial"), "{table}");
    s.audit_clean(run);
}

#[test]
fn a_schema_that_does_not_compile_stops_the_batch_at_its_file_and_line() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\n\
         output_schema = { type = \"object\", properties = { n = { type = \"strin\" } } }\n",
    );
    let out = s.run(&[
        "--quiet",
        "run",
        "--run-id",
        "never",
        batch.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "batch.toml:4: field `output_schema`: not a valid JSON Schema at /properties/n/type"
        ),
        "{stderr}"
    );
    assert!(!s.state_dir().join("runs/never").exists(), "nothing ran");
}
