//! tidy's size rule: no product function is longer than [`MAX_FN_LINES`] lines.
//!
//! Product code is every `.rs` file under `crates/*/src/`, except the test kit, the files that
//! are test modules (`tests.rs`, anything under a `src/**/tests/` directory) and the trailing
//! `#[cfg(test)]` module of a file. A function's length runs from its `fn` line to the closing
//! brace at the same indent, as `cargo fmt` lays it out (declarations without a body, in traits,
//! count nothing). Examples, benches and `xtask` are tools, not product, and are not measured.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// The most lines a product function may have, its `fn` line and closing brace included.
pub(crate) const MAX_FN_LINES: usize = 150;

/// One line per product function over [`MAX_FN_LINES`] under `root/crates`.
pub(crate) fn problems(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for path in crate::tidy::files_under(&root.join("crates"), ".rs")? {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel = rel.to_string_lossy().replace('\\', "/");
        if !is_product(&rel) {
            continue;
        }
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for f in long_functions(&text) {
            out.push(format!(
                "{rel}:{} fn {} is {} lines (at most {MAX_FN_LINES}): split it",
                f.line, f.name, f.lines
            ));
        }
    }
    Ok(out)
}

/// Whether a workspace-relative path is product source that the size rule measures.
fn is_product(rel: &str) -> bool {
    let Some(rest) = rel.strip_prefix("crates/") else {
        return false;
    };
    let Some((krate, in_crate)) = rest.split_once('/') else {
        return false;
    };
    let Some(src) = in_crate.strip_prefix("src/") else {
        return false;
    };
    krate != "testkit"
        && rel.ends_with(".rs")
        && !src
            .split('/')
            .any(|part| part == "tests" || part == "tests.rs")
}

/// A function found too long.
#[derive(Debug, PartialEq, Eq)]
struct Long {
    /// Its `fn` line, 1-based.
    line: usize,
    name: String,
    lines: usize,
}

/// The functions of a file's text, above its trailing `#[cfg(test)]` item, longer than
/// [`MAX_FN_LINES`].
fn long_functions(text: &str) -> Vec<Long> {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        if let Some(len) = body_length(&lines, i)
            && len > MAX_FN_LINES
        {
            out.push(Long {
                line: i + 1,
                name: name.to_owned(),
                lines: len,
            });
        }
    }
    out
}

/// The name of the function a line opens, if it opens one (`pub(crate) async fn name(`...).
fn fn_name(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return None;
    }
    let mut words = trimmed.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let qualifier = word.starts_with("pub")
            || matches!(word, "const" | "async" | "unsafe" | "extern" | "default")
            || word.starts_with('"');
        if word == "fn" {
            let next = words.peek()?;
            let end = next
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(next.len());
            return (end > 0).then(|| &next[..end]);
        }
        if !qualifier {
            return None;
        }
    }
    None
}

/// The length of the function whose `fn` line is `lines[start]`, up to the closing brace at its
/// indent; `None` for a declaration without a body.
fn body_length(lines: &[&str], start: usize) -> Option<usize> {
    let first = lines[start];
    let indent = first.len() - first.trim_start().len();
    let head = first.trim_end();
    if head.ends_with(';') {
        return None;
    }
    if head.ends_with('}') && head.contains('{') {
        return Some(1);
    }
    for (offset, line) in lines[start + 1..].iter().enumerate() {
        let own = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if own != indent || trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with('}') {
            return Some(offset + 2);
        }
        if trimmed.ends_with(';') {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize) -> String {
        (0..n)
            .map(|i| format!("        let x{i} = {i};\n"))
            .collect()
    }

    /// A function of `total` lines at one indent level, inside an impl.
    fn method(name: &str, total: usize) -> String {
        format!(
            "    pub(crate) fn {name}(\n        &self,\n    ) -> u32 {{\n{}        0\n    }}\n",
            body(total - 5)
        )
    }

    #[test]
    fn a_planted_long_function_is_named_with_its_line_and_length() {
        let text = format!(
            "//! x\nimpl A {{\n{}{}}}\n",
            method("short", 150),
            method("long", 151)
        );
        let found = long_functions(&text);
        assert_eq!(
            found,
            [Long {
                line: 153,
                name: "long".to_owned(),
                lines: 151
            }]
        );
    }

    #[test]
    fn declarations_one_liners_and_test_modules_count_nothing() {
        let text = format!(
            "//! x\ntrait T {{\n    fn a(&self) -> u32;\n    fn b(\n        &self,\n    ) -> u32;\n    fn c(&self) {{}}\n}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            method("huge", 400)
        );
        assert!(long_functions(&text).is_empty());
    }

    #[test]
    fn where_clauses_and_nested_braces_do_not_end_a_function() {
        let text = format!(
            "//! x\nfn f<T>(t: T) -> u32\nwhere\n    T: Copy,\n{{\n    if true {{\n{}    }}\n    0\n}}\n",
            body(160)
        );
        let found = long_functions(&text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].lines, 168);
    }

    #[test]
    fn only_product_sources_are_measured() {
        assert!(is_product("crates/core/src/validate.rs"));
        assert!(is_product("crates/runner/src/engine/mod.rs"));
        assert!(!is_product("crates/core/src/state/tests.rs"));
        assert!(!is_product("crates/batch/src/tests/cases.rs"));
        assert!(!is_product("crates/core/tests/plan.rs"));
        assert!(!is_product("crates/runner/examples/scale_bench.rs"));
        assert!(!is_product("crates/testkit/src/lib.rs"));
        assert!(!is_product("xtask/src/bench.rs"));
    }

    #[test]
    fn names_are_read_past_qualifiers() {
        assert_eq!(fn_name("pub(crate) async fn go(x: u8) {"), Some("go"));
        assert_eq!(
            fn_name("    pub unsafe extern \"C\" fn hook() {"),
            Some("hook")
        );
        assert_eq!(fn_name("const fn k<T>() -> u8 {"), Some("k"));
        assert_eq!(fn_name("    let f = |x| x;"), None);
        assert_eq!(fn_name("    // fn commented()"), None);
    }
}
