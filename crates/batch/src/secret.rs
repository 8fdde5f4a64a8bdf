//! #34: an environment value given by reference (`{ from_env = "NAME" }`, `{ from_file =
//! "PATH" }`), resolved when an attempt launches and never kept anywhere but in the child's
//! environment; and the redaction that takes every resolved value out of what a run keeps
//! (`[redacted:NAME]`).
//!
//! Redaction is by exact bytes: a value the task prints split across two writes of one line
//! is still found, but one split across two lines, or printed in another encoding (base64,
//! JSON escapes, URL encoding), is not.

use std::borrow::Cow;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A task's environment value: a plain string, or a reference to a secret.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// The value itself, as written in the batch (kept in `env.json`, never journaled).
    Plain(String),
    /// The value of sortie's own environment variable of this name, at launch.
    FromEnv {
        /// The variable's name.
        from_env: String,
    },
    /// The content of this file (`~` is the home directory), its trailing newline trimmed.
    FromFile {
        /// The file, as written.
        from_file: String,
    },
}

impl std::fmt::Debug for EnvValue {
    /// A plain value is not shown: it may be a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvValue::Plain(_) => f.write_str("Plain(..)"),
            EnvValue::FromEnv { from_env } => write!(f, "FromEnv({from_env})"),
            EnvValue::FromFile { from_file } => write!(f, "FromFile({from_file})"),
        }
    }
}

impl From<String> for EnvValue {
    fn from(s: String) -> EnvValue {
        EnvValue::Plain(s)
    }
}

impl From<&str> for EnvValue {
    fn from(s: &str) -> EnvValue {
        EnvValue::Plain(s.to_owned())
    }
}

impl EnvValue {
    /// Whether it is a reference (its value is a secret, redacted wherever the run keeps it).
    pub fn is_reference(&self) -> bool {
        !matches!(self, EnvValue::Plain(_))
    }

    /// Its value now: a reference is read from the environment or its file. The error names
    /// the variable `name` and what could not be read.
    pub fn resolve(&self, name: &str) -> Result<String, String> {
        let value = match self {
            EnvValue::Plain(s) => return Ok(s.clone()),
            EnvValue::FromEnv { from_env } => match std::env::var(from_env) {
                Ok(v) => v,
                Err(std::env::VarError::NotPresent) => {
                    return Err(format!(
                        "env.{name}: the environment variable {from_env} (`from_env`) is not set"
                    ));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!(
                        "env.{name}: the environment variable {from_env} (`from_env`) is not UTF-8"
                    ));
                }
            },
            EnvValue::FromFile { from_file } => {
                let path = expand_home(from_file);
                match std::fs::read_to_string(&path) {
                    Ok(text) => trim_newline(text),
                    Err(e) => {
                        return Err(format!(
                            "env.{name}: cannot read {} (`from_file`): {e}",
                            path.display()
                        ));
                    }
                }
            }
        };
        if value.contains('\0') {
            return Err(format!("env.{name}: its value holds a NUL byte"));
        }
        Ok(value)
    }
}

/// `~` or `~/...` under `$HOME`; any other path as written.
pub fn expand_home(path: &str) -> PathBuf {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    match (path.strip_prefix('~'), home) {
        (Some(""), Some(home)) => PathBuf::from(home),
        (Some(rest), Some(home)) if rest.starts_with('/') => {
            PathBuf::from(home).join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(path),
    }
}

fn trim_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

/// An environment resolved for a launch: the child's variables, and the secrets among them.
#[derive(Default)]
pub struct Resolved {
    /// Every variable with its value.
    pub env: Vec<(String, String)>,
    /// What takes the references' values out of text.
    pub redactor: Redactor,
}

/// Resolves every value of `env`; the first reference that cannot be read is the error.
pub fn resolve_env(env: &[(String, EnvValue)]) -> Result<Resolved, String> {
    let mut out = Resolved::default();
    for (name, value) in env {
        let v = value.resolve(name)?;
        if value.is_reference() {
            out.redactor.add(name, &v);
        }
        out.env.push((name.clone(), v));
    }
    Ok(out)
}

/// The secret values of a run's task and their names; replaces each by `[redacted:NAME]`.
#[derive(Clone, Default)]
pub struct Redactor {
    /// (value, name), the longest value first (a value inside another is not matched first).
    secrets: Vec<(String, String)>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|(_, n)| n.as_str()).collect();
        f.debug_struct("Redactor").field("names", &names).finish()
    }
}

impl Redactor {
    /// Adds a secret; an empty value is never matched.
    pub fn add(&mut self, name: &str, value: &str) {
        if value.is_empty() {
            return;
        }
        self.secrets.push((value.to_owned(), name.to_owned()));
        self.secrets
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.cmp(b)));
        self.secrets.dedup_by(|a, b| a.0 == b.0);
    }

    /// Whether it has no secret.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced by `[redacted:NAME]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (value, name) in &self.secrets {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &tag(name)));
            }
        }
        out
    }

    /// `bytes` with every secret replaced by `[redacted:NAME]`.
    pub fn redact_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        for (value, name) in &self.secrets {
            let v = value.as_bytes();
            let mut next = Vec::with_capacity(out.len());
            let mut at = 0;
            while let Some(i) = find(&out[at..], v) {
                next.extend_from_slice(&out[at..at + i]);
                next.extend_from_slice(tag(name).as_bytes());
                at += i + v.len();
            }
            next.extend_from_slice(&out[at..]);
            out = next;
        }
        out
    }

    /// Masks every secret in `bytes` in place, keeping their length (a transcript's offsets
    /// stay true): see [`mask`].
    pub fn mask_in_place(&self, bytes: &mut [u8]) -> bool {
        let mut changed = false;
        for (value, name) in &self.secrets {
            let v = value.as_bytes();
            let mut at = 0;
            while let Some(i) = find(&bytes[at..], v) {
                let start = at + i;
                bytes[start..start + v.len()].copy_from_slice(&mask(name, v.len()));
                at = start + v.len();
                changed = true;
            }
        }
        changed
    }
}

/// What a secret of `name` becomes in text.
pub(crate) fn tag(name: &str) -> String {
    format!("[redacted:{name}]")
}

/// The byte a masked secret is padded with on disk ([`unpad`] takes it out).
pub const PAD: u8 = 0x7f;

/// A secret `len` bytes long masked in a file: its tag padded with [`PAD`] to `len` bytes, or
/// when the tag is longer, `*` × `len`.
pub(crate) fn mask(name: &str, len: usize) -> Vec<u8> {
    let tag = tag(name);
    if tag.len() > len {
        return vec![b'*'; len];
    }
    let mut out = tag.into_bytes();
    out.resize(len, PAD);
    out
}

/// A masked transcript's text as a person reads it: the padding after a tag taken out.
pub fn unpad(line: &[u8]) -> Cow<'_, [u8]> {
    if !line.contains(&PAD) {
        return Cow::Borrowed(line);
    }
    let mut out = Vec::with_capacity(line.len());
    for &b in line {
        if b == PAD && in_tag(&out) {
            continue;
        }
        out.push(b);
    }
    Cow::Owned(out)
}

/// Whether `out` ends with a tag (`[redacted:NAME]`).
fn in_tag(out: &[u8]) -> bool {
    let Some(open) = out.iter().rposition(|&b| b == b'[') else {
        return false;
    };
    out[open..].starts_with(b"[redacted:") && out.ends_with(b"]")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_replaced_by_its_name_in_text_and_masked_at_its_length_on_disk() {
        let mut r = Redactor::default();
        r.add("KEY", "sk-0123456789abcdef");
        r.add("SHORT", "abc");
        assert_eq!(
            r.redact("a sk-0123456789abcdef b abc"),
            "a [redacted:KEY] b [redacted:SHORT]"
        );
        let mut bytes = b"x sk-0123456789abcdef y abc\n".to_vec();
        let before = bytes.len();
        assert!(r.mask_in_place(&mut bytes));
        assert_eq!(bytes.len(), before);
        assert_eq!(unpad(&bytes).as_ref(), b"x [redacted:KEY] y ***\n");
    }

    #[test]
    fn a_missing_reference_names_the_variable_and_the_file() {
        let v = EnvValue::FromEnv {
            from_env: "SORTIE_TEST_SURELY_UNSET_34".into(),
        };
        let e = v.resolve("OPENAI_API_KEY").err().unwrap_or_default();
        assert!(e.contains("OPENAI_API_KEY") && e.contains("SORTIE_TEST_SURELY_UNSET_34"));
        let f = EnvValue::FromFile {
            from_file: "/nonexistent/sortie/key".into(),
        };
        let e = f.resolve("K").err().unwrap_or_default();
        assert!(e.contains("/nonexistent/sortie/key"), "{e}");
    }

    #[test]
    fn references_round_trip_through_json_and_plain_values_stay_strings() {
        let env = vec![
            ("A".to_owned(), EnvValue::from("plain")),
            (
                "B".to_owned(),
                EnvValue::FromFile {
                    from_file: "~/k".into(),
                },
            ),
        ];
        let json = serde_json::to_string(&env).unwrap_or_default();
        assert_eq!(json, r#"[["A","plain"],["B",{"from_file":"~/k"}]]"#);
        let back: Vec<(String, EnvValue)> = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(back, env);
    }
}
