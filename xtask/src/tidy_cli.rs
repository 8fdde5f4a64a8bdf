//! `cargo xtask tidy`'s rule for a thin CLI: no file under `crates/cli/src` names the runner's
//! process internals (`sortie_runner::process`) or the journal's handle
//! (`sortie_journal::Journal`). The CLI reads runs through `sortie_runner::layout::open` and
//! starts processes through the runner's own rooms (`detach`, the engine).
//!
//! The files are read as tokens (comments and string literals left out), so every form counts:
//! a path (`sortie_runner::process::spawn`), a `use` group at any depth
//! (`use sortie_journal::{Closing, Journal}`, `use sortie_runner::{layout, process::X}`), and,
//! since they would hide the name from this rule, a glob (`sortie_journal::*`) or an alias
//! (`use sortie_runner as r`) of either crate.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// The directory the rule covers.
const CLI_SRC: &str = "crates/cli/src";

/// The crates watched and the one name each must not be reached for.
const FORBIDDEN: &[(&str, &str)] = &[("sortie_runner", "process"), ("sortie_journal", "Journal")];

/// Every problem the rule finds in the workspace at `root`, one line each.
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for path in crate::tidy::files_under(&root.join(CLI_SRC), ".rs")? {
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        for (line, what) in violations(&text) {
            problems.push(format!(
                "{}:{line}: the CLI names {what}: read runs through \
                 sortie_runner::layout::open, spawn through the runner's rooms",
                rel.display()
            ));
        }
    }
    Ok(problems)
}

/// A token of Rust source: an identifier (or number), `::`, or one other character.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    line: usize,
}

/// The forbidden names `text` reaches for, each with its line (from 1).
fn violations(text: &str) -> Vec<(usize, String)> {
    let tokens = tokenize(text);
    let mut found = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let Some((krate, name)) = FORBIDDEN.iter().find(|(k, _)| t.text == *k) else {
            continue;
        };
        let next = |k: usize| tokens.get(i + k).map(|t| t.text.as_str());
        match (next(1), next(2)) {
            (Some("::"), Some(n)) if n == *name => {
                found.push((t.line, format!("{krate}::{name}")));
            }
            (Some("::"), Some("*")) => found.push((t.line, format!("{krate}::*"))),
            (Some("::"), Some("{")) => {
                for line in in_group(&tokens[i + 3..], name) {
                    found.push((line, format!("{krate}::{name} (in a use group)")));
                }
            }
            (Some("as"), _) => found.push((t.line, format!("{krate} under another name"))),
            _ => {}
        }
    }
    found
}

/// The lines of the items of a `use` group (its tokens after `{`) that start with `name` (or
/// are a glob), at the group's own level: `{a, name::b}` and `{a::{c, name}}` both count.
fn in_group(tokens: &[Token], name: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut depth = 1usize;
    // Whether the next token starts an item of the group at `depth` (each level's items count:
    // `x::{name}` reaches `x::name`, not the crate's `name`, so only the top level counts).
    let mut item_start = true;
    for t in tokens {
        match t.text.as_str() {
            "{" => {
                depth += 1;
                item_start = false;
            }
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," => item_start = depth == 1,
            word => {
                if item_start && depth == 1 && (word == name || word == "*") {
                    lines.push(t.line);
                }
                item_start = false;
            }
        }
    }
    lines
}

/// `text` as tokens, comments and string and char literals left out.
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while let Some(&c) = chars.get(i) {
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while chars.get(i).is_some_and(|&c| c != '\n') {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            i += 1;
            while let Some(&s) = chars.get(i) {
                line += usize::from(s == '\n');
                i += if s == '\\' { 2 } else { 1 };
                if s == '"' {
                    break;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && raw_string_end(&chars, i).is_some()
        {
            let end = raw_string_end(&chars, i).unwrap_or(chars.len());
            line += chars[i..end].iter().filter(|&&c| c == '\n').count();
            i = end;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3; // 'x'
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{..}': past the quote, the backslash and the escaped character.
            i += 3;
            while chars.get(i).is_some_and(|&c| c != '\'') {
                i += 1;
            }
            i += 1;
        } else if ident(c) {
            let start = i;
            while chars.get(i).is_some_and(|&c| ident(c)) {
                i += 1;
            }
            tokens.push(Token {
                text: chars[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && next == Some(':') {
            tokens.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// The index just after the raw string literal that starts at `start` (`r"..."`, `r#"..."#`),
/// if one does.
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    let mut i = start + 1;
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<usize> {
        violations(text).into_iter().map(|(l, _)| l).collect()
    }

    #[test]
    fn paths_to_the_forbidden_names_are_found_with_their_line() {
        let text = "//! A file.\n\
                    use sortie_runner::process::spawn;\n\
                    fn f() { sortie_runner::process::run_hook_in(a, b, c); }\n\
                    fn g() -> sortie_journal::Journal { todo() }\n\
                    use sortie_runner::detach;\n";
        assert_eq!(lines(text), [2, 3, 4]);
    }

    #[test]
    fn use_groups_at_any_depth_and_over_lines_are_found() {
        let text = "use sortie_journal::{Closing, Journal};\n\
                    use sortie_runner::{\n    layout,\n    process::{self, Kept},\n};\n\
                    use sortie_runner::{process};\n\
                    use sortie_journal::{Error as E, Journal as J};\n";
        assert_eq!(lines(text), [1, 4, 6, 7]);
    }

    #[test]
    fn a_name_below_another_module_or_a_longer_name_is_not_the_forbidden_one() {
        let text = "use sortie_runner::{layout::{open::RunReader, process}, engine};\n\
                    use sortie_journal::{JournalError, Error, CheckedReplay};\n\
                    use sortie_runner::layout::open::RunReader;\n\
                    fn f(e: sortie_journal::Error, p: std::process::ExitCode) {}\n\
                    use sortie_runner::processes;\n";
        assert!(violations(text).is_empty(), "{:?}", violations(text));
    }

    #[test]
    fn globs_and_aliases_that_would_hide_a_name_are_found() {
        let text = "use sortie_journal::*;\nuse sortie_runner::{layout, *};\n\
                    use sortie_runner as r;\nuse sortie_batch as batch;\n";
        assert_eq!(lines(text), [1, 2, 3]);
    }

    #[test]
    fn comments_and_strings_do_not_count() {
        let text = "// sortie_runner::process::spawn\n\
                    /* sortie_journal::Journal\n sortie_runner::process */\n\
                    /// see `sortie_journal::Journal`\n\
                    let s = \"sortie_runner::process\";\n\
                    let r = r#\"sortie_journal::Journal \"quoted\"\"#;\n\
                    let c = '\"'; let q = '\\'';\n\
                    let l = 'a';\n\
                    sortie_runner::process::X;\n";
        assert_eq!(lines(text), [9]);
    }

    #[test]
    fn a_planted_violation_in_a_cli_tree_is_named_by_file_and_line() {
        let tmp = std::env::temp_dir().join(format!("tidy-cli-{}", std::process::id()));
        let src = tmp.join(CLI_SRC).join("commands");
        fs::create_dir_all(&src).expect("mkdir");
        fs::write(src.join("ok.rs"), "//! Fine.\nuse sortie_runner::detach;\n").expect("write");
        fs::write(
            src.join("bad.rs"),
            "//! Not fine.\n\nuse sortie_journal::{Closing, Journal};\n",
        )
        .expect("write");
        let problems = check(&tmp).expect("the tree reads");
        let _ = fs::remove_dir_all(&tmp);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "crates/cli/src/commands/bad.rs:3: the CLI names sortie_journal::Journal"
            ),
            "{problems:?}"
        );
    }
}
