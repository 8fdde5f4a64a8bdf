//! docs/batch-file.md against the loader: every name the parser accepts (the lists of
//! `sortie_batch::known_fields`, the ones it matches keys against) has a row in the reference's
//! section for it, and every row names a field the loader accepts.
//!
//! A row is a table line whose first cell is one code span: `| \`name\` | ... |`. A row may
//! name a sub-field (`max_output.bytes`): its part before the first dot must be a field of the
//! section.

use std::collections::BTreeSet;

use sortie_batch::known_fields;

/// Each section of the reference, by its heading, and the loader's list for it.
const SECTIONS: &[(&str, &[&str])] = &[
    ("## Run level", known_fields::RUN),
    ("## `[budget]`", known_fields::BUDGET),
    ("## `[pools.NAME]`", known_fields::POOL),
    ("## `[agents.NAME]`", known_fields::AGENT),
    ("## Task fields", known_fields::TASK),
    ("## `slurm`", known_fields::SLURM),
    ("## `ray`", known_fields::RAY),
];

fn reference() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/batch-file.md");
    std::fs::read_to_string(path).expect("docs/batch-file.md")
}

/// The names of the rows under `heading` (up to the next `## ` heading).
fn rows(doc: &str, heading: &str) -> Option<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    lines.next()?;
    let names = lines
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let first = l.strip_prefix('|')?.split('|').next()?.trim();
            let name = first.strip_prefix('`')?.strip_suffix('`')?;
            (!name.contains('`')).then(|| name.to_owned())
        })
        .collect();
    Some(names)
}

/// What is wrong between `doc` and the loader's lists, one line per problem.
fn problems(doc: &str, sections: &[(&str, &[&str])]) -> Vec<String> {
    let mut out = Vec::new();
    for (heading, known) in sections {
        let Some(rows) = rows(doc, heading) else {
            out.push(format!("no section `{heading}`"));
            continue;
        };
        let given: BTreeSet<&str> = rows.iter().map(String::as_str).collect();
        for name in known.iter().filter(|n| !given.contains(**n)) {
            out.push(format!(
                "{heading}: `{name}` is accepted by the loader but has no row"
            ));
        }
        for row in &rows {
            let field = row.split('.').next().unwrap_or(row);
            if !known.contains(&field) {
                out.push(format!(
                    "{heading}: `{row}` is not a field the loader accepts"
                ));
            }
        }
    }
    out
}

#[test]
fn the_reference_names_every_field_the_loader_accepts() {
    let found = problems(&reference(), SECTIONS);
    assert!(
        found.is_empty(),
        "docs/batch-file.md:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_field_left_out_or_made_up_is_found() {
    let doc = "## Task fields\n\n| field | type |\n|---|---|\n| `prompt` | string |\n\
               | `max_output.bytes` | integer |\n| `colour` | string |\n\n## Next\n| `label` | x |\n";
    let found = problems(
        doc,
        &[("## Task fields", &["prompt", "label", "max_output"])],
    );
    assert_eq!(
        found,
        vec![
            "## Task fields: `label` is accepted by the loader but has no row",
            "## Task fields: `max_output` is accepted by the loader but has no row",
            "## Task fields: `colour` is not a field the loader accepts",
        ]
    );
    let missing = problems("## Other\n", &[("## Task fields", &["prompt"])]);
    assert_eq!(missing, vec!["no section `## Task fields`"]);
}
