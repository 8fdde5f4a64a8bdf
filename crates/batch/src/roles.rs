//! Roles (`role = "reviewer"`, issue 13): named agent definitions, each a Markdown file whose
//! front matter gives agent fields and whose body is a system prompt, as pi's and Claude Code's
//! own agent files are written:
//!
//! ```text
//! ---
//! name: reviewer
//! description: Reviews a change
//! model: sonnet
//! permissions: read-only
//! tools: Read, Grep, Glob
//! thinking: high
//! ---
//! You review code. Report problems with file and line; change nothing.
//! ```
//!
//! `NAME.md` is looked up, first found wins, in `.sortie/agents/`, `.pi/agents/` and
//! `.claude/agents/` of the batch file's directory (of the current directory for a one-off),
//! then in the user's own agent folders (`$PI_CODING_AGENT_DIR/agents` or `~/.pi/agent/agents`,
//! `$CLAUDE_CONFIG_DIR/agents` or `~/.claude/agents`), then among the built-in roles `scout`,
//! `coder` and `reviewer`. The front matter is the small part of YAML these files use: one
//! `key: value` per line, a value plain or quoted, a list as `[a, b]` or (for `tools`) `a, b`.
//! Keys sortie does not take (`name`, `description`, `color`, ...: the agents' own) are
//! ignored; `model: inherit` means the agent's own model. A file that has no front matter is
//! all system prompt.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sortie_core::Permissions;

use crate::error::Issues;
use crate::fields::RawTask;

/// One role, read from its file or built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Role {
    /// Its name (`role = "NAME"`).
    pub(crate) name: String,
    /// Its file; None: built in.
    pub(crate) file: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) permissions: Option<Permissions>,
    pub(crate) tools: Option<Vec<String>>,
    pub(crate) thinking: Option<String>,
    /// #33: when the task's needs let it run (a judge's role may say `settled`).
    pub(crate) needs_mode: Option<sortie_core::NeedsMode>,
    /// #34: the role's sandbox (`sandbox: off` or `workspace`).
    pub(crate) sandbox: Option<sortie_core::sandbox::Sandbox>,
    /// The body: appended to the agent's system prompt (before the task's own).
    pub(crate) system_prompt: Option<String>,
    /// #33: the role's check (`verify: CMD`, run with `sh -c`) and its feedback rounds.
    pub(crate) verify: Option<Vec<String>>,
    pub(crate) verify_rounds: Option<u32>,
}

/// Where a role used by a batch came from, and which tasks use it (for `sortie check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleUse {
    /// The role's name.
    pub name: String,
    /// Its file; None: a built-in role.
    pub file: Option<PathBuf>,
    /// The labels of the tasks that use it, in batch order.
    pub tasks: Vec<String>,
}

/// The built-in roles: (name, permissions, system prompt).
const BUILTIN: &[(&str, Permissions, &str)] = &[
    (
        "scout",
        Permissions::ReadOnly,
        "You are a scout. Explore the code base to answer the task: find the files, \
         functions and data involved and how they fit together, and report them with paths \
         and line numbers. Do not change anything.",
    ),
    (
        "coder",
        Permissions::Edit,
        "You are a coder. Make the change the task asks for, keep it focused, follow the code \
         base's conventions, run the tests that cover it, and finish by saying what you \
         changed and how you checked it.",
    ),
    (
        "reviewer",
        Permissions::ReadOnly,
        "You are a reviewer. Read the code or change the task names and report real problems \
         (bugs, missing tests, unclear or risky code), each with its file and line and why it \
         matters, most important first. Do not change anything.",
    ),
];

/// The names of the built-in roles.
pub(crate) fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _, _)| *n)
}

/// Refuses a role name that cannot be a file name in an agents folder.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a role name is a file name without `.md` (letters, digits, `-`, `_`, `.`), \
             found {name:?}"
        ))
    }
}

/// The folders a role is looked up in, in order: the project's (under `base`), then the user's.
pub(crate) fn search_dirs(base: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [".sortie/agents", ".pi/agents", ".claude/agents"]
        .iter()
        .map(|d| base.join(d))
        .collect();
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = var("HOME");
    if let Some(pi) =
        var("PI_CODING_AGENT_DIR").or_else(|| home.as_ref().map(|h| h.join(".pi/agent")))
    {
        dirs.push(pi.join("agents"));
    }
    if let Some(claude) =
        var("CLAUDE_CONFIG_DIR").or_else(|| home.as_ref().map(|h| h.join(".claude")))
    {
        dirs.push(claude.join("agents"));
    }
    dirs
}

/// Finds role `name` in `dirs`, then among the built-in roles. Ok(None): nowhere. Err: its file
/// is malformed (reported in `issues`).
pub(crate) fn find(name: &str, dirs: &[PathBuf], issues: &mut Issues) -> Result<Option<Role>, ()> {
    for dir in dirs {
        let file = dir.join(format!("{name}.md"));
        let limit = sortie_core::bounds::input_limits::ROLE_FILE;
        let text = match crate::read::read_limited(&file, "a role file", limit) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if file.is_dir() => {
                let _ = e;
                continue;
            }
            Err(e) => {
                issues.add(&file, None, None, format!("cannot read the role file: {e}"));
                return Err(());
            }
        };
        let Ok(text) = String::from_utf8(text) else {
            issues.add(&file, None, None, "a role file must be UTF-8 text");
            return Err(());
        };
        return parse(name, &file, &text, issues).map(Some);
    }
    Ok(BUILTIN
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(n, p, prompt)| Role {
            name: (*n).to_owned(),
            file: None,
            model: None,
            permissions: Some(*p),
            tools: None,
            thinking: None,
            needs_mode: None,
            sandbox: None,
            system_prompt: Some((*prompt).to_owned()),
            verify: None,
            verify_rounds: None,
        }))
}

/// Reads a role file; every problem is an issue at its line.
fn parse(name: &str, file: &Path, text: &str, issues: &mut Issues) -> Result<Role, ()> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut role = Role {
        name: name.to_owned(),
        file: Some(file.to_path_buf()),
        model: None,
        permissions: None,
        tools: None,
        thinking: None,
        needs_mode: None,
        sandbox: None,
        system_prompt: None,
        verify: None,
        verify_rounds: None,
    };
    let lines: Vec<&str> = text.lines().collect();
    let opens = lines.first().is_some_and(|l| l.trim_end() == "---");
    let body_start = if opens {
        let Some(close) = lines.iter().skip(1).position(|l| l.trim_end() == "---") else {
            issues.add(
                file,
                Some(1),
                None,
                "the front matter opened here is never closed (a line `---`)",
            );
            return Err(());
        };
        let mut ok = true;
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, line) in lines[1..=close].iter().enumerate() {
            let n = i + 2;
            if let Err(message) = front_matter_line(&mut role, line, n, &mut seen) {
                let field = line.split_once(':').map(|(k, _)| k.trim());
                issues.add(file, Some(n), field, message);
                ok = false;
            }
        }
        if !ok {
            return Err(());
        }
        close + 2
    } else {
        0
    };
    let body = lines.get(body_start..).unwrap_or_default().join("\n");
    let body = body.trim();
    if !body.is_empty() {
        role.system_prompt = Some(body.to_owned());
    }
    Ok(role)
}

/// One line of the front matter.
fn front_matter_line<'a>(
    role: &mut Role,
    line: &'a str,
    n: usize,
    seen: &mut BTreeMap<&'a str, usize>,
) -> Result<(), String> {
    let trimmed = line.trim();
    // Blank lines, comments, and the indented lines of a value the agents' own formats give
    // over several lines (a `description` with examples): sortie takes none of those keys.
    if trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with([' ', '\t']) {
        return Ok(());
    }
    let Some((key, value)) = line.split_once(':') else {
        return Err("expected `key: value`".into());
    };
    let key = key.trim();
    let value = value.trim();
    const TAKEN: &[&str] = &[
        "model",
        "permissions",
        "tools",
        "thinking",
        "verify",
        "verify_rounds",
        "needs_mode",
        "sandbox",
    ];
    if !TAKEN.contains(&key) {
        return Ok(());
    }
    if let Some(first) = seen.insert(key, n) {
        return Err(format!("`{key}` is given twice (also line {first})"));
    }
    if value.is_empty() || value.starts_with(['|', '>']) {
        return Err(format!("`{key}` needs its value on the same line"));
    }
    match key {
        "model" => {
            let model = unquote(value)?;
            if model != "inherit" && !model.is_empty() {
                role.model = Some(model);
            }
        }
        "permissions" => {
            let p = unquote(value)?;
            role.permissions = Some(Permissions::parse(&p).ok_or_else(|| {
                format!("expected \"read-only\", \"edit\" or \"full\", found {p:?}")
            })?);
        }
        // #33: a role's check and its feedback rounds.
        "verify" => {
            let check = unquote(value)?;
            if check.trim().is_empty() {
                return Err("`verify` must not be empty".into());
            }
            role.verify = Some(vec!["sh".into(), "-c".into(), check]);
        }
        "verify_rounds" => {
            let n = unquote(value)?;
            role.verify_rounds = Some(
                n.parse::<u32>()
                    .ok()
                    .filter(|n| *n <= 20)
                    .ok_or_else(|| format!("expected a whole number from 0 to 20, found {n:?}"))?,
            );
        }
        "thinking" => {
            let level = unquote(value)?;
            if !sortie_core::spec::THINKING_LEVELS.contains(&level.as_str()) {
                return Err(format!(
                    "expected one of {}, found {level:?}",
                    sortie_core::spec::THINKING_LEVELS.join(", ")
                ));
            }
            role.thinking = Some(level);
        }
        // #34: the role's sandbox.
        "sandbox" => {
            let mode = unquote(value)?;
            role.sandbox = Some(
                sortie_core::sandbox::Sandbox::parse(&mode)
                    .ok_or_else(|| format!("expected \"workspace\" or \"off\", found {mode:?}"))?,
            );
        }
        // #33: a judge over samples.
        "needs_mode" => {
            let mode = unquote(value)?;
            role.needs_mode =
                Some(sortie_core::NeedsMode::parse(&mode).ok_or_else(|| {
                    format!("expected \"completed\" or \"settled\", found {mode:?}")
                })?);
        }
        _ => {
            let inner = match value.strip_prefix('[') {
                Some(rest) => rest
                    .strip_suffix(']')
                    .ok_or("a list opened with `[` must close with `]` on the same line")?,
                None => value,
            };
            let tools = inner
                .split(',')
                .map(|t| unquote(t.trim()))
                .collect::<Result<Vec<_>, _>>()?;
            if tools.iter().any(String::is_empty) {
                return Err("a tool name must not be empty".into());
            }
            role.tools = Some(tools);
        }
    }
    Ok(())
}

/// A plain or quoted scalar.
fn unquote(value: &str) -> Result<String, String> {
    for q in ['"', '\''] {
        if let Some(rest) = value.strip_prefix(q) {
            return rest
                .strip_suffix(q)
                .map(str::to_owned)
                .ok_or_else(|| format!("a value opened with {q} must close with {q}"));
        }
    }
    Ok(value.to_owned())
}

/// The roles a batch's tasks (and `[defaults]`) name, each looked up once as the layers that
/// name it are seen; a role that is nowhere, or whose file is malformed, is an issue (at the
/// `role` key of every layer that names it, or in the file).
pub(crate) struct RoleBook {
    dirs: Vec<PathBuf>,
    /// By name. None: not found anywhere; a malformed file is reported where it is, and left
    /// out.
    looked_up: BTreeMap<String, Option<Option<Role>>>,
    /// The `role` keys reported unknown already (file, line).
    reported: std::collections::BTreeSet<(PathBuf, Option<usize>)>,
}

impl RoleBook {
    /// A book for a batch whose relative paths start at `base`.
    pub(crate) fn new(base: &Path) -> RoleBook {
        RoleBook {
            dirs: search_dirs(base),
            looked_up: BTreeMap::new(),
            reported: std::collections::BTreeSet::new(),
        }
    }

    /// Looks up the role `layer` names, if any, once per name.
    pub(crate) fn see(&mut self, layer: &RawTask, issues: &mut Issues) {
        let Some(name) = &layer.role else { return };
        let dirs = &self.dirs;
        let found = self
            .looked_up
            .entry(name.clone())
            .or_insert_with(|| find(name, dirs, issues).ok());
        if !matches!(found, Some(None)) {
            return;
        }
        let line = layer.keys.get("role").copied().flatten();
        if !self.reported.insert((layer.file.clone(), line)) {
            return;
        }
        let places: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        issues.add(
            &layer.file,
            line,
            Some("role"),
            format!(
                "unknown role {name:?}: no {name}.md in {}, and no built-in role of that name \
                 (the built-in roles: {})",
                places.join(", "),
                builtin_names().collect::<Vec<_>>().join(", ")
            ),
        );
    }

    /// The role named `name`, if it was seen and found.
    pub(crate) fn get(&self, name: &str) -> Option<&Role> {
        self.looked_up.get(name)?.as_ref()?.as_ref()
    }

    /// The roles found, by name.
    pub(crate) fn found(&self) -> impl Iterator<Item = &Role> {
        self.looked_up.values().filter_map(|r| r.as_ref()?.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> (Result<Role, ()>, Vec<String>) {
        let mut issues = Issues::default();
        let r = parse("r", Path::new("/p/r.md"), text, &mut issues);
        (r, issues.0.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn a_role_file_gives_its_fields_and_its_body_is_the_system_prompt() {
        let (role, issues) = parse_text(
            "---\nname: r\ndescription: Use it\n  for reviews\nmodel: \"sonnet\"\n\
             permissions: read-only\ntools: Read, Grep\nthinking: high\ncolor: red\n---\n\n\
             Review it.\nCarefully.\n",
        );
        assert!(issues.is_empty(), "{issues:?}");
        let role = role.unwrap();
        assert_eq!(role.model.as_deref(), Some("sonnet"));
        assert_eq!(role.permissions, Some(Permissions::ReadOnly));
        assert_eq!(role.tools, Some(vec!["Read".into(), "Grep".into()]));
        assert_eq!(role.thinking.as_deref(), Some("high"));
        assert_eq!(
            role.system_prompt.as_deref(),
            Some("Review it.\nCarefully.")
        );
        let (role, _) = parse_text("---\nmodel: inherit\ntools: [read, 'bash']\n---\n");
        let role = role.unwrap();
        assert_eq!((role.model, role.system_prompt), (None, None));
        assert_eq!(role.tools, Some(vec!["read".into(), "bash".into()]));
        let (role, _) = parse_text("Just a prompt.\n");
        assert_eq!(
            role.unwrap().system_prompt.as_deref(),
            Some("Just a prompt.")
        );
    }

    #[test]
    fn a_malformed_role_file_is_named_with_its_line() {
        let (r, issues) = parse_text("---\nmodel: x\n");
        assert!(r.is_err());
        assert_eq!(
            issues,
            ["/p/r.md:1: the front matter opened here is never closed (a line `---`)"]
        );
        let (r, issues) = parse_text(
            "---\nmodel: x\njust words\npermissions: write\nthinking: max\nmodel: y\n\
             tools: [a, b\n---\nbody\n",
        );
        assert!(r.is_err());
        assert_eq!(
            issues,
            [
                "/p/r.md:3: expected `key: value`",
                "/p/r.md:4: field `permissions`: expected \"read-only\", \"edit\" or \"full\", \
                 found \"write\"",
                "/p/r.md:5: field `thinking`: expected one of off, minimal, low, medium, high, \
                 xhigh, found \"max\"",
                "/p/r.md:6: field `model`: `model` is given twice (also line 2)",
                "/p/r.md:7: field `tools`: a list opened with `[` must close with `]` on the \
                 same line",
            ]
        );
    }

    #[test]
    fn the_first_folder_holding_the_role_wins_then_the_built_ins() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("reviewer.md"), "---\nmodel: m-b\n---\nFrom b.\n").unwrap();
        std::fs::write(b.join("mine.md"), "---\nmodel: m-b\n---\n").unwrap();
        std::fs::write(a.join("mine.md"), "---\nmodel: m-a\n---\n").unwrap();
        let dirs = [a.clone(), b.clone()];
        let mut issues = Issues::default();
        let mine = find("mine", &dirs, &mut issues).unwrap().unwrap();
        assert_eq!(
            (mine.model.as_deref(), mine.file),
            (Some("m-a"), Some(a.join("mine.md")))
        );
        let reviewer = find("reviewer", &dirs, &mut issues).unwrap().unwrap();
        assert_eq!(reviewer.system_prompt.as_deref(), Some("From b."));
        let scout = find("scout", &dirs, &mut issues).unwrap().unwrap();
        assert_eq!(
            (scout.file, scout.permissions),
            (None, Some(Permissions::ReadOnly))
        );
        assert_eq!(find("nobody", &dirs, &mut issues), Ok(None));
        assert!(issues.0.is_empty());
    }
}
