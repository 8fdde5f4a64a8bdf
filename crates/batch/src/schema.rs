//! A task's `output_schema` (issue 13): a JSON Schema given inline (a TOML table, a JSON
//! object) or as the path of a `.json` file, relative to the batch file's directory. It is
//! read, compiled with `jsonschema` (no remote or file `$ref` is ever fetched: those fail to
//! compile) and kept as compact JSON text, which is what the journal holds: a run never reads
//! the schema file again.

use std::path::Path;

use serde_json::Value as J;

use crate::value::{Entry, Val};

/// A schema problem, at the line of the part of the schema it is about when known.
pub(crate) struct SchemaError {
    pub(crate) line: Option<usize>,
    pub(crate) message: String,
}

/// Reads the `output_schema` entry `e` of a table in `file`: the schema as compact JSON.
pub(crate) fn parse(e: &Entry, file: &Path) -> Result<String, SchemaError> {
    let at = |message: String| SchemaError {
        line: e.line,
        message,
    };
    let (schema, inline) = match &e.val {
        Val::Table(_) => (to_json(&e.val).map_err(at)?, true),
        Val::Str(path) if !path.is_empty() => (read_file(file, path).map_err(at)?, false),
        other => {
            return Err(at(format!(
                "expected a JSON Schema (a table) or the path of a .json file, found {}",
                other.kind()
            )));
        }
    };
    if let Err(e2) = jsonschema::validator_for(&schema) {
        let pointer = e2.instance_path().to_string();
        let line = if inline {
            line_of(&e.val, &pointer).or(e.line)
        } else {
            e.line
        };
        let place = if pointer.is_empty() || pointer == "/" {
            String::new()
        } else {
            format!(" at {pointer}")
        };
        let from = match &e.val {
            Val::Str(path) => format!(" in {path}"),
            _ => String::new(),
        };
        return Err(SchemaError {
            line,
            message: format!("not a valid JSON Schema{from}{place}: {e2}"),
        });
    }
    Ok(schema.to_string())
}

/// Reads a schema file, relative to the batch file's directory.
fn read_file(batch_file: &Path, path: &str) -> Result<J, String> {
    let full = match batch_file.parent() {
        Some(dir) if Path::new(path).is_relative() => dir.join(path),
        _ => Path::new(path).to_path_buf(),
    };
    let limit = sortie_core::bounds::input_limits::SCHEMA_FILE;
    let text = crate::read::read_text(&full, "an `output_schema` file", limit)
        .map_err(|e| format!("cannot read the schema file {}: {e}", full.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "the schema file {}:{}:{} is not valid JSON: {e}",
            full.display(),
            e.line(),
            e.column()
        )
    })
}

/// The JSON value of a batch value (keys in file order).
fn to_json(v: &Val) -> Result<J, String> {
    Ok(match v {
        Val::Null => J::Null,
        Val::Bool(b) => J::Bool(*b),
        Val::Int(i) => {
            if let Ok(i) = i64::try_from(*i) {
                J::from(i)
            } else if let Ok(u) = u64::try_from(*i) {
                J::from(u)
            } else {
                return Err(format!("the integer {i} does not fit in a JSON number"));
            }
        }
        Val::Float(f) => serde_json::Number::from_f64(*f)
            .map(J::Number)
            .ok_or_else(|| format!("{f} is not a JSON number"))?,
        Val::Str(s) => J::String(s.clone()),
        Val::Array(items) => J::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Val::Table(entries) => J::Object(
            entries
                .iter()
                .map(|e| Ok((e.key.clone(), to_json(&e.val)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// The line of the deepest key of `v` on the JSON pointer `pointer` (`/properties/n/type`).
fn line_of(v: &Val, pointer: &str) -> Option<usize> {
    let mut at = v;
    let mut line = None;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        match at {
            Val::Table(entries) => {
                let entry = entries.iter().find(|e| e.key == token)?;
                line = entry.line.or(line);
                at = &entry.val;
            }
            Val::Array(items) => at = items.get(token.parse::<usize>().ok()?)?,
            _ => break,
        }
    }
    line
}
