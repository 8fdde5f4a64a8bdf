//! The batch loader's tests of `output_schema` (issue 13): inline (TOML table, JSON object) or
//! a `.json` file relative to the batch file, kept as compact JSON; a schema that is not one is
//! a batch error at its file and line; `{outputs.LABEL.json}` is checked like `{outputs.LABEL}`.

use crate::*;

const SCHEMA: &str = r#"{"properties":{"n":{"type":"integer"}},"required":["n"],"type":"object"}"#;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn load_ok(path: &std::path::Path) -> LoadedBatch {
    load(path, None, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn an_inline_schema_a_file_relative_to_the_batch_and_a_jsonl_object_all_resolve_to_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "conf/schemas/n.json", SCHEMA);
    let toml = write(
        dir.path(),
        "conf/batch.toml",
        "allow_shared_writes = true\n[defaults]\noutput_schema = \"schemas/n.json\"\n\n\
         [[tasks]]\nlabel = \"file\"\nprompt = \"count\"\n\n\
         [[tasks]]\nlabel = \"inline\"\nprompt = \"count\"\n\
         output_schema = { type = \"object\", required = [\"n\"], properties = { n = { type = \"integer\" } } }\n\n\
         [[tasks]]\nlabel = \"uses\"\nneeds = [\"file\"]\nprompt = \"n is {outputs.file.json}\"\n",
    );
    let b = load_ok(&toml).batch;
    let schemas: Vec<Option<&str>> = b.tasks.iter().map(|t| t.output_schema.as_deref()).collect();
    assert_eq!(
        schemas,
        [Some(SCHEMA), Some(SCHEMA), Some(SCHEMA)],
        "a default like any other"
    );

    let jsonl = write(
        dir.path(),
        "b.jsonl",
        &format!("{{\"label\": \"j\", \"prompt\": \"count\", \"output_schema\": {SCHEMA}}}\n"),
    );
    assert_eq!(
        load_ok(&jsonl).batch.tasks[0].output_schema.as_deref(),
        Some(SCHEMA)
    );
}

#[test]
fn a_schema_that_does_not_compile_is_a_batch_error_at_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.json",
        "{\"type\": \"object\",\n \"properties\": {\"n\": {\"type\": 5}}}",
    );
    write(dir.path(), "broken.json", "{\"type\": \n");
    let path = write(
        dir.path(),
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\nprompt = \"x\"\n\
         output_schema = { type = \"object\", properties = { n = { type = \"strin\" } } }\n\n\
         [[tasks]]\nlabel = \"b\"\nprompt = \"x\"\n\
         [tasks.output_schema]\ntype = \"object\"\n\n\
         [tasks.output_schema.properties.n]\ntype = \"strin\"\n\n\
         [[tasks]]\nlabel = \"c\"\nprompt = \"x\"\noutput_schema = \"bad.json\"\n\n\
         [[tasks]]\nlabel = \"d\"\nprompt = \"x\"\noutput_schema = \"broken.json\"\n\n\
         [[tasks]]\nlabel = \"e\"\nprompt = \"x\"\noutput_schema = \"missing.json\"\n\n\
         [[tasks]]\nlabel = \"f\"\nprompt = \"x\"\noutput_schema = 3\n",
    );
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    let lines = crate::tests::places(&err);
    let f = Some("output_schema");
    assert_eq!(
        lines,
        [
            (Some(4), f),
            // A table of its own: the line of the key the problem is about.
            (Some(13), f),
            (Some(18), f),
            (Some(23), f),
            (Some(28), f),
            (Some(33), f),
        ],
        "{text}"
    );
    assert!(text.contains("batch.toml:4: "), "{text}");
    assert!(
        text.contains("not a valid JSON Schema at /properties/n/type"),
        "{text}"
    );
    assert!(
        text.contains("not a valid JSON Schema in bad.json at /properties/n/type"),
        "{text}"
    );
    assert!(
        text.contains("broken.json:2:"),
        "the JSON error's own place: {text}"
    );
    assert!(text.contains("cannot read the schema file"), "{text}");
    assert!(text.contains("found an integer"), "{text}");
}

#[test]
fn a_remote_ref_is_never_fetched_it_does_not_compile() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "batch.toml",
        "[[tasks]]\nprompt = \"x\"\noutput_schema = { \"$ref\" = \"http://127.0.0.1:9/schema.json\" }\n",
    );
    let err = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("batch.toml:3: ") && err.contains("not a valid JSON Schema"),
        "{err}"
    );
}

#[test]
fn outputs_json_names_a_needed_task_that_has_a_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "batch.toml",
        "[[tasks]]\nlabel = \"plain\"\nprompt = \"x\"\n\n\
         [[tasks]]\nlabel = \"s\"\nprompt = \"x\"\noutput_schema = { type = \"object\" }\n\n\
         [[tasks]]\nlabel = \"u\"\nneeds = [\"plain\"]\nprompt = \"{outputs.plain.json} {outputs.s.json}\"\n",
    );
    let err = load(&path, None, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`{outputs.plain.json}` is the structured result of task \"plain\", which has no `output_schema`"),
        "{err}"
    );
    assert!(
        err.contains("`{outputs.s.json}` names task \"s\", which this task does not need"),
        "{err}"
    );
}
