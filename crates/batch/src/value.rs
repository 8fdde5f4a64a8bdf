//! The value tree shared by TOML and JSON: values whose table keys carry their 1-based line,
//! read from TOML with `toml::Spanned` keys or from a JSON object (all on one line).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use toml::Spanned;

/// A parsed value. Keys carry their line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    /// JSON `null`: the same as an absent field.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (wide enough for every TOML and JSON integer).
    Int(i128),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Val>),
    /// A table, its keys in file order.
    Table(Vec<Entry>),
}

/// One key of a table, with the line it is on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The key.
    pub(crate) key: String,
    /// Its 1-based line, when known.
    pub(crate) line: Option<usize>,
    /// Its value.
    pub(crate) val: Val,
}

impl Val {
    /// What the value is, for messages: `a string`, `an array`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Bool(_) => "a boolean",
            Val::Int(_) => "an integer",
            Val::Float(_) => "a float",
            Val::Str(_) => "a string",
            Val::Array(_) => "an array",
            Val::Table(_) => "a table",
        }
    }

    /// A JSON value whose keys are all on `line`.
    pub(crate) fn from_json(v: serde_json::Value, line: Option<usize>) -> Val {
        use serde_json::Value as J;
        match v {
            J::Null => Val::Null,
            J::Bool(b) => Val::Bool(b),
            J::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Val::Int(i128::from(i)),
                (None, Some(u)) => Val::Int(i128::from(u)),
                _ => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Val::Str(s),
            J::Array(a) => Val::Array(a.into_iter().map(|v| Val::from_json(v, line)).collect()),
            J::Object(m) => Val::Table(
                m.into_iter()
                    .map(|(key, v)| Entry {
                        key,
                        line,
                        val: Val::from_json(v, line),
                    })
                    .collect(),
            ),
        }
    }
}

/// A TOML value whose keys keep their byte spans.
pub(crate) enum RawToml {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<RawToml>),
    Table(Vec<(Spanned<String>, RawToml)>),
}

impl<'de> Deserialize<'de> for RawToml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawToml, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawToml;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TOML value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawToml, E> {
                Ok(RawToml::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawToml, E> {
                Ok(RawToml::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawToml, E> {
                i64::try_from(v)
                    .map(RawToml::Int)
                    .map_err(|_| E::custom("integer out of range"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawToml, E> {
                Ok(RawToml::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawToml, E> {
                Ok(RawToml::Str(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<RawToml, E> {
                Ok(RawToml::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawToml, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(RawToml::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawToml, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(RawToml::Table(entries))
            }
        }
        d.deserialize_any(V)
    }
}

impl RawToml {
    /// The value tree, each key's span turned into its line.
    pub(crate) fn lower(self, index: &LineIndex) -> Val {
        match self {
            RawToml::Bool(b) => Val::Bool(b),
            RawToml::Int(i) => Val::Int(i128::from(i)),
            RawToml::Float(f) => Val::Float(f),
            RawToml::Str(s) => Val::Str(s),
            RawToml::Array(a) => Val::Array(a.into_iter().map(|v| v.lower(index)).collect()),
            RawToml::Table(t) => Val::Table(
                t.into_iter()
                    .map(|(k, v)| Entry {
                        line: Some(index.line(k.span().start)),
                        key: k.into_inner(),
                        val: v.lower(index),
                    })
                    .collect(),
            ),
        }
    }
}

/// Byte offset to 1-based line and column.
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub(crate) fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    pub(crate) fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).max(1)
    }

    pub(crate) fn column(&self, text: &str, offset: usize) -> usize {
        let start = self.starts.get(self.line(offset) - 1).copied().unwrap_or(0);
        text.get(start..offset).map_or(1, |s| s.chars().count() + 1)
    }
}

/// Lines of the `[[tasks]]` headers, in order.
pub(crate) fn task_headers(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start()
                .strip_prefix("[[")
                .and_then(|r| r.trim_start().strip_prefix("tasks"))
                .is_some_and(|r| r.trim_start().starts_with("]]"))
        })
        .map(|(i, _)| i + 1)
        .collect()
}
