//! How sortie says a few things, shared by the commands and the printers (`output`,
//! `summary`): a percent, a control action, the `--state-dir` flag of a printed command.

/// ` --state-dir DIR` when the commands printed for the user need it to find this state dir.
pub(crate) fn state_dir_flag(dir: &std::path::Path) -> String {
    if dir == std::path::Path::new(".sortie") || std::env::var_os("SORTIE_DIR").is_some() {
        String::new()
    } else {
        format!(" --state-dir {}", dir.display())
    }
}

/// A control action as people say it: `hold`, `steer: "message"`, `concurrency 2`.
pub(crate) fn control_text(action: &sortie_core::ControlAction) -> String {
    use sortie_core::ControlAction as A;
    match action {
        A::Steer { message, .. } => format!("steer: {message:?}"),
        A::Concurrency { n } => format!("concurrency {n}"),
        A::Hold { task: None } | A::Release { task: None } | A::Cancel { task: None } => {
            format!("{} of the run", action.name())
        }
        other => other.name().to_owned(),
    }
}

/// `used` as a whole percent of `of`.
pub(crate) fn percent(used: u64, of: u64) -> u128 {
    u128::from(used) * 100 / u128::from(of.max(1))
}

/// #32: one line for a rebuild of the journal by `sortie recover` (replay, status, audit).
pub(crate) fn recovery_line(kept: u64, lost: Option<(u64, u64)>, restored: usize) -> String {
    let lost = match lost {
        Some((first, last)) => format!(", records {first}..={last} lost"),
        None => String::new(),
    };
    format!(
        "recovered after damage: {kept} records read back{lost}, {restored} attempt(s) restored \
         from their files"
    )
}

/// Off a terminal (a pipe, a file), tables are laid out for this many columns (docs/cli.md).
pub(crate) const PLAIN_WIDTH: usize = 80;

/// The width stdout's tables fit: the terminal's columns, or [`PLAIN_WIDTH`] off a terminal.
pub(crate) fn stdout_width() -> usize {
    let term = console::Term::stdout();
    if term.is_term() {
        term.size_checked()
            .map_or(PLAIN_WIDTH, |(_, cols)| usize::from(cols).max(20))
    } else {
        PLAIN_WIDTH
    }
}

/// `line` cut to `width` characters (with `…` when it was longer).
pub(crate) fn fit(line: &str, width: usize) -> String {
    crate::board::cut(line, width)
}

/// `parts` joined with ` · `, starting a new line (indented by two) before a part that would
/// run past `width`.
pub(crate) fn wrap_parts(parts: &[String], width: usize) -> String {
    let mut out = String::new();
    let mut line_len = 0;
    for (i, part) in parts.iter().enumerate() {
        let n = part.chars().count();
        if i > 0 {
            if line_len + 3 + n > width {
                out.push_str("\n  ");
                line_len = 2;
            } else {
                out.push_str(" · ");
                line_len += 3;
            }
        }
        out.push_str(part);
        line_len += n;
    }
    out
}
