//! A batch's problems: one located issue each ([`BatchIssue`]), gathered and sorted into one
//! [`BatchError`].

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a batch, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchIssue {
    /// The file it is in, as the caller named it ([`COMMAND_LINE`](crate::COMMAND_LINE) for a one-off).
    pub file: PathBuf,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The field as written in the file (`max_retries`, `max_output.bytes`, `agents.demo.protocol`).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for BatchIssue {
    /// `batch.toml:12: field `max_retries`: expected an integer, found a string`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a batch did not load. Nothing runs after either.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A file could not be read, or the current directory could not be found.
    #[error("{}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The batch has problems: every one found, one per line, in file order.
    #[error("{}", issues_text(.errors))]
    Invalid {
        /// The problems.
        errors: Vec<BatchIssue>,
    },
}

impl BatchError {
    /// The located problems (empty for an I/O error).
    pub fn issues(&self) -> &[BatchIssue] {
        match self {
            BatchError::Io { .. } => &[],
            BatchError::Invalid { errors } => errors,
        }
    }
}

fn issues_text(errors: &[BatchIssue]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The issues found so far, in the order found.
#[derive(Default)]
pub(crate) struct Issues(pub(crate) Vec<BatchIssue>);

impl Issues {
    /// Adds one issue.
    pub(crate) fn add(
        &mut self,
        file: &Path,
        line: Option<usize>,
        field: Option<&str>,
        message: impl Into<String>,
    ) {
        self.0.push(BatchIssue {
            file: file.to_path_buf(),
            line,
            field: field.map(str::to_owned),
            message: message.into(),
        });
    }

    /// The issues in file order: files in `order` first (in that order), then by line.
    pub(crate) fn into_error(mut self, order: &[&Path]) -> BatchError {
        let rank = |f: &Path| order.iter().position(|o| *o == f).unwrap_or(order.len());
        self.0.sort_by_key(|i| (rank(&i.file), i.line.unwrap_or(0)));
        BatchError::Invalid { errors: self.0 }
    }
}
