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

/// The width stdout's tables fit: the terminal's columns; off a terminal, `COLUMNS` when it
/// is a number (at least 20), else [`PLAIN_WIDTH`].
pub(crate) fn stdout_width() -> usize {
    let term = console::Term::stdout();
    if term.is_term() {
        term.size_checked()
            .map_or(PLAIN_WIDTH, |(_, cols)| usize::from(cols).max(20))
    } else {
        plain_width(std::env::var("COLUMNS").ok().as_deref())
    }
}

/// The width off a terminal, given `COLUMNS`.
fn plain_width(columns: Option<&str>) -> usize {
    columns
        .and_then(|c| c.trim().parse::<usize>().ok())
        .map_or(PLAIN_WIDTH, |c| c.max(20))
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

/// `text` in lines of at most `width` columns, broken between words, the lines after the first
/// indented by two (a word longer than a line stays whole).
pub(crate) fn wrap_words(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line_len = 0;
    for word in text.split_whitespace() {
        let n = word.chars().count();
        if line_len > 0 && line_len + 1 + n > width {
            out.push_str("\n  ");
            line_len = 2;
        } else if line_len > 0 {
            out.push(' ');
            line_len += 1;
        }
        out.push_str(word);
        line_len += n;
    }
    out
}

/// A printed command (`inspect: sortie replay RUN --task LABEL`) in lines of at most `width`
/// columns, broken between words with a shell continuation (` \\`) and the next line indented
/// by 9, so that it still pastes as one command; a single word longer than a line stays whole.
pub(crate) fn wrap_command(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    const INDENT: &str = "         ";
    let mut out = String::new();
    let mut current = String::new();
    for word in line.split(' ') {
        let with = current.chars().count() + 1 + word.chars().count();
        // Room for the word and the ` \` that ends a continued line.
        if !current.trim().is_empty() && with + 2 > width {
            out.push_str(&current);
            out.push_str(" \\\n");
            current = format!("{INDENT}{word}");
        } else {
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
    }
    out.push_str(&current);
    out
}

/// `text` safe to print on a terminal (core's `view::printable`): what sortie did not write
/// itself (labels, agents' outputs and errors, model names) is shown, never obeyed.
pub(crate) fn printable(text: &str) -> String {
    sortie_core::view::printable(text).into_owned()
}

/// `text` made [`printable`] in place.
fn clean(text: &mut String) {
    if let std::borrow::Cow::Owned(shown) = sortie_core::view::printable(text) {
        *text = shown;
    }
}

fn clean_opt(text: &mut Option<String>) {
    if let Some(t) = text {
        clean(t);
    }
}

/// A task's view made [`printable`] for the text tables (the `--json` views stay as they are:
/// JSON escapes control characters itself).
pub(crate) fn printable_task(mut t: crate::output::TaskView) -> crate::output::TaskView {
    clean(&mut t.label);
    clean_opt(&mut t.model);
    clean_opt(&mut t.error);
    clean_opt(&mut t.text);
    clean_opt(&mut t.artifact);
    clean_opt(&mut t.waiting_for_pool);
    clean_opt(&mut t.role);
    clean_opt(&mut t.session);
    t.models.iter_mut().for_each(clean_opt);
    t.net.iter_mut().for_each(|f| clean(&mut f.host));
    if let Some(w) = &mut t.worktree {
        clean(&mut w.path);
        clean(&mut w.branch);
        clean_opt(&mut w.diff);
    }
    t
}

/// A run's view with each task's made [`printable`] (see [`printable_task`]).
pub(crate) fn printable_run(mut v: crate::output::RunView) -> crate::output::RunView {
    v.tasks = std::mem::take(&mut v.tasks)
        .into_iter()
        .map(printable_task)
        .collect();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_a_terminal_columns_sets_the_width_and_anything_else_is_80() {
        assert_eq!(plain_width(None), PLAIN_WIDTH);
        assert_eq!(plain_width(Some("200")), 200);
        assert_eq!(plain_width(Some("5")), 20);
        assert_eq!(plain_width(Some("wide")), PLAIN_WIDTH);
    }

    #[test]
    fn a_long_command_is_broken_between_words_and_still_reads_as_one() {
        let c = "inspect: sortie --state-dir /a/rather/long/state/dir replay \
                 20261205-102341-8284 --task a-task-with-a-rather-long-label-07";
        let wrapped = wrap_command(c, 50);
        assert!(wrapped.lines().count() > 1, "{wrapped}");
        for line in wrapped.lines() {
            assert!(line.chars().count() <= 50, "{line:?}");
        }
        // What a shell reads: each ` \` and newline, then the indent, is a space.
        assert_eq!(wrapped.replace(" \\\n         ", " "), c);
        assert_eq!(
            wrap_command("status:  sortie status R", 80),
            "status:  sortie status R"
        );
        // A word longer than a line stays whole.
        let long = format!("diff:    sortie diff R {}", "x".repeat(60));
        assert!(wrap_command(&long, 40).ends_with(&"x".repeat(60)));
    }

    #[test]
    fn the_total_line_breaks_between_its_parts() {
        let parts: Vec<String> = [
            "total: 5000 task(s)",
            "completed 4999, failed 1",
            "0 tokens",
        ]
        .map(str::to_owned)
        .into();
        assert_eq!(
            wrap_parts(&parts, 48),
            "total: 5000 task(s) · completed 4999, failed 1\n  0 tokens"
        );
    }
}
