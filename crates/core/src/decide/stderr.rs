//! Which line of an agent's stderr names its failure: the first line that reads as an error,
//! else the last non-blank line. An agent often ends its stderr with help (a link, a hint, a
//! path to its docs) after the line that says what went wrong; the last line alone names the
//! wrong thing.

/// The words that make a stderr line read as an error, matched in the line's lower case.
const ERROR_MARKERS: [&str; 7] = [
    "error",
    "fatal",
    "panicked",
    "no api key",
    "invalid api key",
    "unauthorized",
    "failed",
];

/// Whether `line` reads as an error (it names one of [`ERROR_MARKERS`]).
pub fn is_error_line(line: &str) -> bool {
    let lower = line.to_lowercase();
    ERROR_MARKERS.iter().any(|m| lower.contains(m))
}

/// The line of `stderr` that names the failure, trimmed: the first non-blank line that
/// [`is_error_line`], else the last non-blank line; `None` when every line is blank.
pub fn error_line(stderr: &str) -> Option<&str> {
    let mut lines = stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut last = None;
    for line in lines.by_ref() {
        if is_error_line(line) {
            return Some(line);
        }
        last = Some(line);
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_without_an_api_key_is_named_by_its_first_line_not_the_docs_path() {
        let stderr = "No API key found for the selected model.\n\n\
                      Use /login or set an API key environment variable. See:\n  \
                      /usr/lib/node_modules/pi/docs/models.md\n";
        assert_eq!(
            error_line(stderr),
            Some("No API key found for the selected model.")
        );
    }

    #[test]
    fn an_error_line_after_warnings_is_chosen() {
        let stderr =
            "Warning: Using custom model id\nError: No API key found for provider x\nhint\n";
        assert_eq!(
            error_line(stderr),
            Some("Error: No API key found for provider x")
        );
        let traceback = "Traceback (most recent call last):\n  File \"a.py\", line 1\n\
                         ValueError: bad value\n";
        assert_eq!(error_line(traceback), Some("ValueError: bad value"));
        assert_eq!(
            error_line("thread 'main' panicked at src/main.rs:2:5:\nboom\nnote: RUST_BACKTRACE"),
            Some("thread 'main' panicked at src/main.rs:2:5:")
        );
    }

    #[test]
    fn without_an_error_line_the_last_non_blank_line_is_chosen() {
        assert_eq!(
            error_line("starting\nfake agent crashed\n\n"),
            Some("fake agent crashed")
        );
        assert_eq!(error_line("  \n\n"), None);
        assert_eq!(error_line(""), None);
    }
}
