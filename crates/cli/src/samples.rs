//! #33: the views of a run's samples (core's `samples`): per item `n`, `c`, pass@k, the mean
//! score and the winner; per model and per role the pass rate with its 95% Wilson interval.
//! `sortie results` prints them (a table, `--json`, `--jsonl`), the end-of-run summary and the
//! HTML report show the per-item counts.

use serde::Serialize;
use sortie_core::RunState;
use sortie_core::samples::{self, Rate};

use crate::text::printable;

/// The most pass@k columns the text table shows (`--json` has them all).
pub(crate) const SHOWN_K: usize = 5;

/// One item's samples.
#[derive(Debug, Serialize)]
pub(crate) struct ItemView {
    /// The item's name (`fix-a-*`).
    pub(crate) item: String,
    /// Its judged samples.
    pub(crate) n: u32,
    /// Of which passed.
    pub(crate) c: u32,
    /// pass@1 ..= pass@n.
    pub(crate) pass_at: Vec<f64>,
    /// The mean score (0 to 1), null while no sample is judged.
    pub(crate) mean_score: Option<f64>,
    /// The winner's label under `pick`, once there is one.
    pub(crate) winner: Option<String>,
    /// Its samples, judged or not.
    pub(crate) samples: usize,
    /// The template's `pick`.
    pub(crate) pick: Option<&'static str>,
}

/// A pass rate, for JSON.
#[derive(Debug, Serialize)]
pub(crate) struct RateView {
    /// The model or role.
    pub(crate) name: String,
    /// Judged tasks.
    pub(crate) n: u32,
    /// Of which passed.
    pub(crate) c: u32,
    /// c / n.
    pub(crate) rate: f64,
    /// The 95% Wilson interval: [low, high].
    pub(crate) wilson95: [f64; 2],
}

/// Pass rates per model and per role.
#[derive(Debug, Serialize)]
pub(crate) struct RatesView {
    /// Per model.
    pub(crate) models: Vec<RateView>,
    /// Per role.
    pub(crate) roles: Vec<RateView>,
}

/// The items of `state`'s samples (empty for a run without).
pub(crate) fn items(state: &RunState) -> Vec<ItemView> {
    samples::items(state)
        .into_iter()
        .map(|i| ItemView {
            winner: i.winner.map(|w| state.label(w).to_string()),
            samples: i.samples.len(),
            pick: i.pick.map(|p| p.as_str()),
            item: i.name,
            n: i.n,
            c: i.c,
            pass_at: i.pass_at,
            mean_score: i.mean_score,
        })
        .collect()
}

fn rate_view(r: Rate) -> RateView {
    RateView {
        name: r.name,
        n: r.n,
        c: r.c,
        rate: r.rate,
        wilson95: [r.low, r.high],
    }
}

/// The pass rates of `state`.
pub(crate) fn rates(state: &RunState) -> RatesView {
    let r = samples::rates(state);
    RatesView {
        models: r.by_model.into_iter().map(rate_view).collect(),
        roles: r.by_role.into_iter().map(rate_view).collect(),
    }
}

/// The samples table: one line per item, pass@1 up to pass@5 (a note when more exist).
pub(crate) fn items_table(items: &[ItemView]) -> Vec<String> {
    let width = items
        .iter()
        .map(|i| printable(&i.item).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let max_n = items.iter().map(|i| i.pass_at.len()).max().unwrap_or(0);
    let ks = max_n.clamp(1, SHOWN_K);
    let mut head = format!("{:<width$}  {:>3}  {:>3}", "ITEM", "N", "C");
    for k in 1..=ks {
        head.push_str(&format!("  {:>7}", format!("PASS@{k}")));
    }
    head.push_str("  MEAN   WINNER");
    let mut lines = vec![head];
    for i in items {
        let mut line = format!("{:<width$}  {:>3}  {:>3}", printable(&i.item), i.n, i.c);
        for k in 0..ks {
            let cell = i
                .pass_at
                .get(k)
                .map_or("-".to_owned(), |p| format!("{p:.3}"));
            line.push_str(&format!("  {cell:>7}"));
        }
        let mean = i.mean_score.map_or("-".to_owned(), |m| format!("{m:.3}"));
        let winner = i.winner.as_deref().map_or("-".to_owned(), printable);
        line.push_str(&format!("  {mean:<5}  {winner}"));
        lines.push(line.trim_end().to_owned());
    }
    if max_n > SHOWN_K {
        lines.push(format!(
            "(pass@{} to pass@{max_n}: sortie --json results)",
            SHOWN_K + 1
        ));
    }
    lines
}

/// A rates table (`MODEL` or `ROLE`): name, passed of judged, rate, 95% Wilson interval.
pub(crate) fn rates_table(what: &str, rates: &[RateView]) -> Vec<String> {
    let width = rates
        .iter()
        .map(|r| printable(&r.name).chars().count())
        .max()
        .unwrap_or(0)
        .max(what.len());
    let mut lines = vec![format!(
        "{what:<width$}  {:>9}  {:>5}  95% INTERVAL",
        "PASSED", "RATE"
    )];
    for r in rates {
        lines.push(format!(
            "{:<width$}  {:>9}  {:>5.3}  [{:.3}, {:.3}]",
            printable(&r.name),
            format!("{}/{}", r.c, r.n),
            r.rate,
            r.wilson95[0],
            r.wilson95[1]
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str, n: u32, c: u32) -> ItemView {
        ItemView {
            item: name.to_owned(),
            n,
            c,
            pass_at: (1..=n).map(|k| samples::pass_at_k(n, c, k)).collect(),
            mean_score: Some(f64::from(c) / f64::from(n)),
            winner: None,
            samples: n as usize,
            pick: None,
        }
    }

    #[test]
    fn the_table_shows_pass_at_1_to_5_and_says_where_the_rest_are() {
        let lines = items_table(&[item("a-*", 8, 2), item("b\u{1b}[2J-*", 3, 3)]);
        assert!(
            lines[0].contains("PASS@5") && !lines[0].contains("PASS@6"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("a-*") && lines[1].contains("0.250"),
            "{lines:?}"
        );
        // An item with fewer samples shows `-` past its n; a label's escape is shown, not obeyed.
        assert!(
            lines[2].contains("  -  ") && !lines[2].contains('\u{1b}'),
            "{lines:?}"
        );
        assert_eq!(lines[3], "(pass@6 to pass@8: sortie --json results)");
        let rates = rates_table(
            "MODEL",
            &[RateView {
                name: "m".into(),
                n: 10,
                c: 5,
                rate: 0.5,
                wilson95: [0.2366, 0.7634],
            }],
        );
        assert_eq!(rates[1], "m           5/10  0.500  [0.237, 0.763]");
    }
}
