//! `cargo xtask tidy`: architecture checks that read files, not code.
//!
//! - Dependency direction: each member's manifest is read and a forbidden edge fails (core
//!   knows nothing of tokio, sled, bincode, clap, anyhow or the crates above it; the pure
//!   crates, the protocol readers and the batch loader, nothing of those nor nix (they cannot
//!   spawn), the journal or the crates above them; the journal nothing of tokio, clap, anyhow,
//!   the runner or the cli; the runner nothing of the cli, clap or anyhow; anyhow appears only
//!   in the cli and xtask). `[dependencies]`, `[build-dependencies]` and their `[target.*]`
//!   forms count; dev-dependencies do not, since they never reach a user.
//!   The test kit (`sortie-testkit`) is dev-only: no product crate has it in those tables
//!   (xtask may, for the torture).
//! - File docs: every `.rs` file under `crates/`, `xtask/` and `tests/` begins with `//!`.
//! - Spawning: no product source outside the runner's two spawning rooms calls
//!   `Command::new`: `crates/runner/src/process/` (sortie's children) and
//!   `crates/runner/src/supervisor/` (the programs that outlive sortie, which start the agents
//!   themselves). Clippy's `disallowed-methods` says the same of the call sites; this names
//!   the rooms.
//! - Spawning: no product source outside `crates/runner/src/process/` calls `Command::new`
//!   (clippy's `disallowed-methods` says the same of the call sites; this names the room).
//! - Executors: no product code outside the runner's `executor/` (and the crates that hold
//!   their configuration) tells an executor apart by name (`tidy_executors.rs`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// What the pure crates (the protocol readers, the batch loader) must not depend on: no
/// runtime, storage, process or command-line crate, nothing above core.
const PURE: &[&str] = &[
    "tokio",
    "sled",
    "bincode",
    "clap",
    "anyhow",
    "nix",
    "sortie-journal",
    "sortie-runner",
    "sortie-cli",
];

/// Packages and the dependencies each must not have.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "sortie-core",
        &[
            "tokio",
            "sled",
            "bincode",
            "clap",
            "anyhow",
            "sortie-journal",
            "sortie-runner",
            "sortie-cli",
        ],
    ),
    (
        "sortie-journal",
        &["tokio", "clap", "anyhow", "sortie-runner", "sortie-cli"],
    ),
    ("sortie-protocol", PURE),
    ("sortie-batch", PURE),
    ("sortie-runner", &["sortie-cli", "clap", "anyhow"]),
];

/// The only packages that may depend on anyhow.
const ANYHOW_ALLOWED: &[&str] = &["sortie-cli", "xtask"];

/// The test kit, and the only packages that may have it as a normal dependency.
const TESTKIT: (&str, &[&str]) = ("sortie-testkit", &["xtask"]);

/// The directories whose `.rs` files must start with a `//!` doc comment.
const DOC_ROOTS: &[&str] = &["crates", "xtask", "tests"];

/// Every problem found in the workspace at `root`, as one line each (empty: tidy).
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for manifest in member_manifests(root)? {
        let text = fs::read_to_string(&manifest)
            .with_context(|| format!("reading {}", manifest.display()))?;
        let table: toml::Table = text
            .parse()
            .with_context(|| format!("parsing {}", manifest.display()))?;
        let rel = manifest.strip_prefix(root).unwrap_or(&manifest);
        for p in edge_problems(&table) {
            problems.push(format!("{}: {p}", rel.display()));
        }
    }
    for dir in DOC_ROOTS {
        let dir = root.join(dir);
        if dir.is_dir() {
            doc_problems(root, &dir, &mut problems)?;
        }
    }
    problems.extend(crate::tidy_size::problems(root)?);
    problems.extend(crate::tidy_docs::check(root)?);
    problems.extend(crate::tidy_cli::check(root)?);
    problems.extend(crate::tidy_executors::check(root)?);
    Ok(problems)
}

/// The manifests of the workspace members (`members` entries, with `dir/*` globs expanded).
fn member_manifests(root: &Path) -> Result<Vec<PathBuf>> {
    let text =
        fs::read_to_string(root.join("Cargo.toml")).context("reading the root Cargo.toml")?;
    let table: toml::Table = text.parse().context("parsing the root Cargo.toml")?;
    let members = table
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .context("the root Cargo.toml has no workspace.members")?;
    let mut out = Vec::new();
    for m in members {
        let m = m.as_str().context("workspace.members holds a non-string")?;
        if let Some(parent) = m.strip_suffix("/*") {
            let dir = root.join(parent);
            let mut found: Vec<PathBuf> = fs::read_dir(&dir)
                .with_context(|| format!("listing {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path().join("Cargo.toml")))
                .filter(|p| p.is_file())
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(root.join(m).join("Cargo.toml"));
        }
    }
    Ok(out)
}

/// The package names a manifest depends on (normal and build, any target), renames resolved.
fn dependencies(manifest: &toml::Table) -> Vec<String> {
    let mut tables: Vec<&toml::Table> = Vec::new();
    for key in ["dependencies", "build-dependencies"] {
        if let Some(t) = manifest.get(key).and_then(|t| t.as_table()) {
            tables.push(t);
        }
    }
    if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
        for target in targets.values().filter_map(|t| t.as_table()) {
            for key in ["dependencies", "build-dependencies"] {
                if let Some(t) = target.get(key).and_then(|t| t.as_table()) {
                    tables.push(t);
                }
            }
        }
    }
    let mut names: Vec<String> = tables
        .into_iter()
        .flat_map(|t| t.iter())
        .map(|(key, spec)| {
            spec.get("package")
                .and_then(|p| p.as_str())
                .unwrap_or(key)
                .to_owned()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The forbidden edges of one manifest.
fn edge_problems(manifest: &toml::Table) -> Vec<String> {
    let Some(package) = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
    else {
        return vec!["no [package] name".to_owned()];
    };
    let deps = dependencies(manifest);
    let mut problems = Vec::new();
    if let Some((_, forbidden)) = FORBIDDEN.iter().find(|(p, _)| *p == package) {
        for dep in deps.iter().filter(|d| forbidden.contains(&d.as_str())) {
            problems.push(format!("{package} must not depend on {dep}"));
        }
    }
    if deps.iter().any(|d| d == "anyhow")
        && !ANYHOW_ALLOWED.contains(&package)
        && !problems.iter().any(|p| p.ends_with(" on anyhow"))
    {
        problems.push(format!(
            "{package} must not depend on anyhow (only {} may)",
            ANYHOW_ALLOWED.join(" and ")
        ));
    }
    let (testkit, allowed) = TESTKIT;
    if deps.iter().any(|d| d == testkit) && !allowed.contains(&package) {
        problems.push(format!(
            "{package} must not depend on {testkit} (a dev-dependency only; only {} may)",
            allowed.join(" and ")
        ));
    }
    problems
}

/// Every `.rs` file under `dir` must begin with `//!`, and only the spawning rooms spawn.
fn doc_problems(root: &Path, dir: &Path, problems: &mut Vec<String>) -> Result<()> {
    for path in files_under(dir, ".rs")? {
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        if !starts_with_file_doc(&text) {
            problems.push(format!(
                "{} does not begin with a //! doc comment",
                rel.display()
            ));
        }
        if spawns_outside_process(rel, &text) {
            problems.push(format!(
                "{} spawns a process: only {} may",
                rel.display(),
                SPAWNING_ROOMS.join(" and ")
            ));
        }
    }
    Ok(())
}

/// Every file under `dir` whose name ends with `suffix` (`.rs`, `.md`), at any depth but in
/// `target` and hidden directories, sorted; none when `dir` does not exist. Every tidy rule
/// reads the tree through this.
pub(crate) fn files_under(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>> {
    fn collect(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) -> Result<()> {
        if !dir.is_dir() {
            return Ok(());
        }
        for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    collect(&path, suffix, out)?;
                }
            } else if name.ends_with(suffix) {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    collect(dir, suffix, &mut out)?;
    out.sort();
    Ok(out)
}

/// The runner's rooms that may create a `Command`: the spawn path of sortie's own children,
/// and the supervisor and shepherd programs, which start the agents that outlive sortie.
const SPAWNING_ROOMS: [&str; 2] = [
    "crates/runner/src/process/",
    "crates/runner/src/supervisor/",
];

/// Whether a product source file outside [`SPAWNING_ROOMS`] calls `Command::new` (its inline
/// test module aside; the test kit is not product code).
fn spawns_outside_process(rel: &Path, text: &str) -> bool {
    let rel = rel.to_string_lossy().replace('\\', "/");
    let product = rel.starts_with("crates/") && rel.contains("/src/");
    if !product
        || rel.starts_with("crates/testkit/")
        || SPAWNING_ROOMS.iter().any(|room| rel.starts_with(room))
    {
        return false;
    }
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .any(|l| l.contains("Command::new("))
}

fn starts_with_file_doc(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').starts_with("//!")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(manifest: &str) -> Vec<String> {
        edge_problems(&manifest.parse().expect("test manifest parses"))
    }

    #[test]
    fn the_workspace_is_tidy() {
        let root = crate::workspace_root();
        let problems = check(&root).expect("tidy can read the workspace");
        assert!(problems.is_empty(), "tidy:\n{}", problems.join("\n"));
    }

    #[test]
    fn forbidden_edges_are_named() {
        assert_eq!(
            problems(
                r#"
                [package]
                name = "sortie-core"
                [dependencies]
                serde.workspace = true
                tokio = "1"
                [target.'cfg(unix)'.dependencies]
                sortie-journal = { path = "../journal" }
                [dev-dependencies]
                sled = "0.34"
                "#
            ),
            [
                "sortie-core must not depend on sortie-journal",
                "sortie-core must not depend on tokio"
            ]
        );
        assert_eq!(
            problems(
                r#"
                [package]
                name = "sortie-runner"
                [dependencies]
                errors = { package = "anyhow", version = "1" }
                "#
            ),
            ["sortie-runner must not depend on anyhow"]
        );
        assert_eq!(
            problems(
                r#"
                [package]
                name = "sortie-protocol"
                [dependencies]
                nix.workspace = true
                sortie-core.workspace = true
                [dev-dependencies]
                nix.workspace = true
                "#
            ),
            ["sortie-protocol must not depend on nix"]
        );
        assert_eq!(
            problems(
                r#"
                [package]
                name = "sortie-extra"
                [build-dependencies]
                anyhow = "1"
                "#
            ),
            ["sortie-extra must not depend on anyhow (only sortie-cli and xtask may)"]
        );
        assert!(
            problems(
                r#"
                [package]
                name = "sortie-cli"
                [dependencies]
                anyhow.workspace = true
                clap.workspace = true
                tokio.workspace = true
                "#
            )
            .is_empty()
        );
    }

    #[test]
    fn the_test_kit_is_a_dev_dependency_of_product_crates() {
        assert_eq!(
            problems(
                r#"
                [package]
                name = "sortie-runner"
                [dependencies]
                sortie-testkit.workspace = true
                "#
            ),
            [
                "sortie-runner must not depend on sortie-testkit (a dev-dependency only; only xtask may)"
            ]
        );
        assert!(
            problems(
                r#"
                [package]
                name = "sortie-cli"
                [dev-dependencies]
                sortie-testkit.workspace = true
                "#
            )
            .is_empty()
        );
        assert!(
            problems(
                r#"
                [package]
                name = "xtask"
                [dependencies]
                sortie-testkit.workspace = true
                "#
            )
            .is_empty()
        );
    }

    #[test]
    fn a_file_doc_is_a_leading_inner_doc_comment() {
        assert!(starts_with_file_doc("//! What this is for.\nfn f() {}"));
        assert!(starts_with_file_doc("\u{feff}//! With a byte order mark."));
        assert!(!starts_with_file_doc("/// An item doc.\nfn f() {}"));
        assert!(!starts_with_file_doc("\n//! Not first."));
        assert!(!starts_with_file_doc("use std::fs;\n"));
    }

    #[test]
    fn only_the_runners_spawning_rooms_spawn() {
        let spawn = "//! x\nfn f() { std::process::Command::new(\"git\"); }\n";
        assert!(spawns_outside_process(
            Path::new("crates/runner/src/kept.rs"),
            spawn
        ));
        assert!(spawns_outside_process(
            Path::new("crates/core/src/plan/mod.rs"),
            spawn
        ));
        assert!(!spawns_outside_process(
            Path::new("crates/runner/src/process/spawn.rs"),
            spawn
        ));
        assert!(!spawns_outside_process(
            Path::new("crates/runner/src/supervisor/shepherd.rs"),
            spawn
        ));
        // A planted spawn in the transcript room (a neighbour of both) is caught.
        assert!(spawns_outside_process(
            Path::new("crates/runner/src/transcript/follow.rs"),
            spawn
        ));
        assert!(!spawns_outside_process(
            Path::new("crates/testkit/src/cmd.rs"),
            spawn
        ));
        assert!(!spawns_outside_process(
            Path::new("tests/e2e/main.rs"),
            spawn
        ));
        let in_tests = "//! x\n#[cfg(test)]\nmod tests { fn f() { Command::new(\"sh\"); } }\n";
        assert!(!spawns_outside_process(
            Path::new("crates/runner/src/kept.rs"),
            in_tests
        ));
    }
}
