//! Tidy's rules for the docs:
//!
//! - ARCHITECTURE.md and README.md are at most [`MAX_LINES`] lines each: a map read in five
//!   minutes, a front page read in one sitting (the detail goes to docs/);
//! - no markdown file points a reader at a file the repository does not have: every relative
//!   markdown link (`[text](path)`, images too) and every path written out to a markdown file
//!   of the docs (`docs/….md`, `../….md`) names a file that exists.
//!
//! Markdown files are found anywhere under the root but in `target` and hidden directories. A
//! link resolves from the linking file's directory; a written-out `docs/` path from the root.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// The most lines ARCHITECTURE.md and README.md may have.
pub(crate) const MAX_LINES: usize = 250;

/// The files held to [`MAX_LINES`], relative to the root.
const SHORT: &[&str] = &["ARCHITECTURE.md", "README.md"];

/// Every problem of the docs under `root`, one line each (empty: tidy).
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for name in SHORT {
        let path = root.join(name);
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        problems.extend(too_long(name, &text));
    }
    for path in crate::tidy::files_under(root, ".md")? {
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        problems.extend(dead_references(root, rel, &text));
    }
    Ok(problems)
}

/// The problem of a file held to [`MAX_LINES`] that is longer.
fn too_long(name: &str, text: &str) -> Option<String> {
    let lines = text.lines().count();
    (lines > MAX_LINES).then(|| {
        format!("{name} has {lines} lines, more than {MAX_LINES}: move the detail into docs/")
    })
}

/// Where a reference is read from.
#[derive(Debug, PartialEq, Eq)]
enum Base {
    /// A markdown link: from the linking file's directory.
    Link,
    /// A path written out: from the root (`docs/…`), or from the file's directory (`../…`).
    Written,
}

/// The references of a markdown text, each with its 1-based line.
fn references(text: &str) -> Vec<(usize, Base, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let inside = rest.split(')').next().unwrap_or_default();
            let target = inside.split_whitespace().next().unwrap_or_default();
            let target = target.trim_start_matches('<').trim_end_matches('>');
            let target = target.split('#').next().unwrap_or_default();
            let outside = target.contains("://") || target.starts_with("mailto:");
            if !target.is_empty() && !outside {
                out.push((n + 1, Base::Link, target.to_owned()));
            }
        }
        let is_path = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
        for token in line.split(|c: char| !is_path(c)) {
            let token = token.trim_end_matches('.');
            let docs = token.starts_with("docs/") || token.starts_with("../");
            let linked = out.iter().any(|(l, _, t)| *l == n + 1 && t == token);
            if docs && token.ends_with(".md") && !linked {
                out.push((n + 1, Base::Written, token.to_owned()));
            }
        }
    }
    out
}

/// The references of the markdown file `rel` (relative to `root`) to files that do not exist.
fn dead_references(root: &Path, rel: &Path, text: &str) -> Vec<String> {
    let dir = root.join(rel.parent().unwrap_or(Path::new("")));
    references(text)
        .into_iter()
        .filter(|(_, from, target)| {
            let base = match from {
                Base::Written if !target.starts_with("../") => root,
                _ => &dir,
            };
            !base.join(target).exists()
        })
        .map(|(line, _, target)| {
            format!(
                "{}:{line}: points to {target}, which is not in the repository",
                rel.display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> String {
        "a line\n".repeat(n)
    }

    #[test]
    fn the_docs_are_tidy() {
        let problems = check(&crate::workspace_root()).expect("tidy can read the docs");
        assert!(problems.is_empty(), "tidy:\n{}", problems.join("\n"));
    }

    #[test]
    fn a_map_over_the_limit_is_named() {
        assert_eq!(too_long("README.md", &lines(MAX_LINES)), None);
        assert_eq!(
            too_long("ARCHITECTURE.md", &lines(MAX_LINES + 1)),
            Some(format!(
                "ARCHITECTURE.md has {} lines, more than {MAX_LINES}: move the detail into docs/",
                MAX_LINES + 1
            ))
        );
    }

    #[test]
    fn a_link_or_path_to_a_missing_file_is_named() {
        let root = crate::workspace_root();
        let text = "See [the fields](batch-file.md#run-level) and [cli](cli.md).\n\
                    The design is in [it](../DESIGN.md) and ../shared/SEMANTICS.md.\n\
                    ![a picture](report.png), [web](https://example.com/x.md), [here](#top).\n\
                    docs/batches.md says so; docs/nowhere.md does not exist.\n";
        assert_eq!(
            dead_references(&root, Path::new("docs/page.md"), text),
            vec![
                "docs/page.md:2: points to ../DESIGN.md, which is not in the repository",
                "docs/page.md:2: points to ../shared/SEMANTICS.md, which is not in the repository",
                "docs/page.md:4: points to docs/nowhere.md, which is not in the repository",
            ]
        );
    }

    #[test]
    fn references_are_read_from_links_and_written_paths() {
        let found = references("[a](x/y.md \"title\") then docs/z.md.\n[b](<w.md>)");
        assert_eq!(
            found,
            vec![
                (1, Base::Link, "x/y.md".to_owned()),
                (1, Base::Written, "docs/z.md".to_owned()),
                (2, Base::Link, "w.md".to_owned()),
            ]
        );
    }
}
