//! Model prices: what sortie charges for the tokens of an agent that reports tokens but no cost
//! (Codex), so that `max_cost` binds it too.
//!
//! Rules:
//! - An agent that reports its own cost (pi, Claude Code) keeps it; an agent whose protocol
//!   reports no cost ([`Protocol::reports_cost`]) has its cost computed from its attempt's
//!   tokens: input, output, cache-read and cache-write tokens, each times its price per
//!   million ([`ModelPrice::cost`]). Such a cost is *priced*, not *reported*.
//! - The built-in table ([`builtin_price`]) holds list prices as of [`PRICES_AS_OF`]; a batch's
//!   `[prices."MODEL"]` tables override and extend it. The batch's loader resolves, once, the
//!   price of every model its tasks name into the run's config ([`RunConfig::prices`]), which
//!   the journal keeps: an attempt's cost is priced when its usage is read, from that stored
//!   price, and journaled with the usage, so replay, resume and a later sortie with a newer
//!   table all see the cost the run saw. Nothing is priced again at read time.
//! - A model is looked up by its name, then by the part after its last `/` (pi's
//!   `provider/model`).
//!
//! [`RunConfig::prices`]: crate::spec::RunConfig::prices

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{Batch, Protocol, TaskSpec};
use crate::usage::{Cost, Usage};

/// The date of the built-in table's list prices.
pub const PRICES_AS_OF: &str = "2025-12-01";

/// The fields of a `[prices."MODEL"]` table, in US dollars per million tokens.
pub const PRICE_FIELDS: &[&str] = &["input", "output", "cache_read", "cache_write"];

/// The prices a run keeps (`RunConfig::prices`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Prices {
    /// The date of the built-in table they were resolved from (empty for a run from before
    /// prices).
    pub as_of: String,
    /// Each model's price, by name.
    pub models: BTreeMap<String, ModelPrice>,
}

/// A model's price, in nano-dollars per million tokens (exact integers: $1.25 is
/// 1,250,000,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ModelPrice {
    /// Per million input tokens (not read from the cache).
    pub input: u64,
    /// Per million output tokens (reasoning included).
    pub output: u64,
    /// Per million tokens read from the provider's cache.
    pub cache_read: u64,
    /// Per million tokens written to the provider's cache.
    pub cache_write: u64,
}

impl ModelPrice {
    /// A price from dollars per million tokens (input, output, cache read, cache write); the
    /// caller has checked each is finite and not negative.
    pub fn from_usd(usd: [f64; 4]) -> ModelPrice {
        let n = |x: f64| {
            let v = (x * 1e9).round();
            if v.is_finite() && v > 0.0 {
                if v >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    v as u64
                }
            } else {
                0
            }
        };
        ModelPrice {
            input: n(usd[0]),
            output: n(usd[1]),
            cache_read: n(usd[2]),
            cache_write: n(usd[3]),
        }
    }

    /// The cost of `usage`'s tokens at this price, rounded to the nano-dollar: a priced cost,
    /// complete (nothing unreported).
    pub fn cost(&self, usage: &Usage) -> Cost {
        let parts = [
            (usage.input, self.input),
            (usage.output, self.output),
            (usage.cache_read, self.cache_read),
            (usage.cache_write, self.cache_write),
        ];
        let sum: u128 = parts
            .iter()
            .map(|&(tokens, price)| u128::from(tokens) * u128::from(price))
            .sum();
        let nanos = (sum + 500_000) / 1_000_000;
        Cost::reported_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// List prices in US dollars per million tokens (input, output, cache read, cache write) as of
/// [`PRICES_AS_OF`]: OpenAI's (no charge for cache writes) and Anthropic's (cache writes at the
/// 5-minute rate), with Claude Code's aliases.
const TABLE: &[(&str, [f64; 4])] = &[
    ("gpt-5", [1.25, 10.0, 0.125, 0.0]),
    ("gpt-5-codex", [1.25, 10.0, 0.125, 0.0]),
    ("gpt-5-mini", [0.25, 2.0, 0.025, 0.0]),
    ("gpt-5-nano", [0.05, 0.40, 0.005, 0.0]),
    ("gpt-5.1", [1.25, 10.0, 0.125, 0.0]),
    ("gpt-5.1-codex", [1.25, 10.0, 0.125, 0.0]),
    ("gpt-5.1-codex-max", [1.25, 10.0, 0.125, 0.0]),
    ("gpt-5.1-codex-mini", [0.25, 2.0, 0.025, 0.0]),
    ("codex-mini-latest", [1.50, 6.0, 0.375, 0.0]),
    ("gpt-4.1", [2.0, 8.0, 0.50, 0.0]),
    ("gpt-4.1-mini", [0.40, 1.60, 0.10, 0.0]),
    ("gpt-4o", [2.50, 10.0, 1.25, 0.0]),
    ("o3", [2.0, 8.0, 0.50, 0.0]),
    ("o3-mini", [1.10, 4.40, 0.55, 0.0]),
    ("o4-mini", [1.10, 4.40, 0.275, 0.0]),
    ("claude-sonnet-4-5", [3.0, 15.0, 0.30, 3.75]),
    ("claude-sonnet-4", [3.0, 15.0, 0.30, 3.75]),
    ("claude-opus-4-5", [5.0, 25.0, 0.50, 6.25]),
    ("claude-opus-4-1", [15.0, 75.0, 1.50, 18.75]),
    ("claude-opus-4", [15.0, 75.0, 1.50, 18.75]),
    ("claude-haiku-4-5", [1.0, 5.0, 0.10, 1.25]),
    ("claude-3-5-haiku", [0.80, 4.0, 0.08, 1.0]),
    ("sonnet", [3.0, 15.0, 0.30, 3.75]),
    ("opus", [5.0, 25.0, 0.50, 6.25]),
    ("haiku", [1.0, 5.0, 0.10, 1.25]),
];

/// The built-in list price of `model` (by its name, then by the part after its last `/`).
pub fn builtin_price(model: &str) -> Option<ModelPrice> {
    let find = |name: &str| {
        TABLE
            .iter()
            .find(|(m, _)| *m == name)
            .map(|(_, usd)| ModelPrice::from_usd(*usd))
    };
    find(model).or_else(|| model.rsplit_once('/').and_then(|(_, m)| find(m)))
}

/// The price of `model` in `prices` (by its name, then by the part after its last `/`).
pub fn lookup(prices: &BTreeMap<String, ModelPrice>, model: &str) -> Option<ModelPrice> {
    prices.get(model).copied().or_else(|| {
        model
            .rsplit_once('/')
            .and_then(|(_, m)| prices.get(m).copied())
    })
}

/// The protocol a task's attempts speak (`plain` for its own command), when its profile is
/// known.
fn protocol_of(batch: &Batch, t: &TaskSpec) -> Option<Protocol> {
    if t.command.is_some() {
        return Some(Protocol::Plain);
    }
    batch.agents.get(&t.agent).map(|p| p.protocol)
}

/// Whether `t`'s cost is sortie's to compute: its agent reports tokens but no cost.
pub fn needs_price(batch: &Batch, t: &TaskSpec) -> bool {
    protocol_of(batch, t).is_some_and(|p| !p.reports_cost())
}

/// The models `t` may run (its model, then its fallbacks; None: the agent's own default).
pub fn models_of(t: &TaskSpec) -> impl Iterator<Item = Option<&str>> {
    std::iter::once(t.model.as_deref()).chain(t.fallback_models.iter().map(|m| Some(m.as_str())))
}

/// The price an attempt on `model` of a task speaking `protocol` is charged at, from the
/// run's resolved `prices`: None when its agent reports its own cost (or no model or price is
/// known: the cost then stays unreported).
pub fn attempt_price(
    prices: &BTreeMap<String, ModelPrice>,
    protocol: Protocol,
    model: Option<&str>,
) -> Option<ModelPrice> {
    if protocol.reports_cost() {
        return None;
    }
    model.and_then(|m| lookup(prices, m))
}

/// The prices a run keeps: `overrides` (the batch's `[prices]`), plus the built-in price of
/// every model a task that needs one names.
pub fn resolve(
    batch: &Batch,
    overrides: &BTreeMap<String, ModelPrice>,
) -> BTreeMap<String, ModelPrice> {
    let mut out = overrides.clone();
    for t in batch.tasks.iter().filter(|t| needs_price(batch, t)) {
        for m in models_of(t).flatten() {
            if lookup(&out, m).is_none()
                && let Some(p) = builtin_price(m)
            {
                out.insert(m.to_owned(), p);
            }
        }
    }
    out
}

/// Whether task `t`'s cost was priced by sortie (its agent reports no cost and the run holds a
/// price for one of its models).
pub fn is_priced(batch: &Batch, t: &TaskSpec) -> bool {
    needs_price(batch, t)
        && models_of(t)
            .flatten()
            .any(|m| lookup(&batch.config.prices.models, m).is_some())
}

/// For people, when the run priced a task's cost (None otherwise): how (`* cost priced by
/// sortie: ...`), naming the table's date.
pub fn priced_note(batch: &Batch) -> Option<String> {
    let priced = batch.tasks.iter().filter(|t| is_priced(batch, t)).count();
    (priced > 0).then(|| {
        format!(
            "* cost priced by sortie for {priced} task(s) whose agent reports no cost: tokens × \
             price per million (list prices as of {}, or the batch's [prices])",
            batch.config.prices.as_of
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_charges_each_kind_of_token_per_million() {
        let p = builtin_price("gpt-5-codex").expect("in the table");
        assert_eq!(p.input, 1_250_000_000);
        let u = Usage {
            input: 100,
            output: 12,
            cache_read: 50,
            ..Usage::ZERO
        };
        // 100 × 1.25 + 12 × 10 + 50 × 0.125 micro-dollars.
        assert_eq!(p.cost(&u), Cost::reported_nanos(251_250));
        let claude = builtin_price("anthropic/claude-sonnet-4-5").expect("by its last part");
        let w = Usage {
            cache_write: 1_000_000,
            ..Usage::ZERO
        };
        assert_eq!(claude.cost(&w).nanos, 3_750_000_000);
        assert_eq!(builtin_price("no-such-model"), None);
    }

    fn batch(tasks: Vec<TaskSpec>, overrides: &[(&str, [f64; 4])]) -> Batch {
        let mut b = Batch {
            tasks,
            agents: crate::spec::AgentProfile::builtins(),
            config: crate::spec::RunConfig::default(),
            source: "b.toml".into(),
        };
        let overrides = overrides
            .iter()
            .map(|(m, usd)| ((*m).to_owned(), ModelPrice::from_usd(*usd)))
            .collect();
        b.config.prices.models = resolve(&b, &overrides);
        b
    }

    fn task(label: &str, agent: &str, model: Option<&str>, fallbacks: &[&str]) -> TaskSpec {
        let mut t = TaskSpec::new(label, "/w");
        t.prompt = Some("p".into());
        t.agent = agent.into();
        t.model = model.map(str::to_owned);
        t.fallback_models = fallbacks.iter().map(|m| (*m).to_owned()).collect();
        t
    }

    #[test]
    fn a_run_keeps_the_prices_its_codex_tasks_need_the_batchs_first() {
        let b = batch(
            vec![
                task("a", "codex", Some("gpt-5-codex"), &["o3", "mine"]),
                task("b", "claude", Some("sonnet"), &[]),
            ],
            &[("mine", [1.0, 2.0, 0.0, 0.0]), ("o3", [9.0, 9.0, 9.0, 9.0])],
        );
        let names: Vec<&str> = b.config.prices.models.keys().map(String::as_str).collect();
        // Claude Code reports its cost: `sonnet` is not needed; the batch's `o3` wins.
        assert_eq!(names, ["gpt-5-codex", "mine", "o3"]);
        assert_eq!(b.config.prices.models["o3"].input, 9_000_000_000);
        assert!(is_priced(&b, &b.tasks[0]) && !is_priced(&b, &b.tasks[1]));
        let models = &b.config.prices.models;
        assert_eq!(
            attempt_price(models, Protocol::ClaudeStreamJson, Some("o3")),
            None
        );
        assert_eq!(
            attempt_price(models, Protocol::CodexJson, Some("openai/mine")),
            Some(ModelPrice::from_usd([1.0, 2.0, 0.0, 0.0]))
        );
        assert_eq!(attempt_price(models, Protocol::CodexJson, None), None);
        assert!(priced_note(&b).is_some_and(|n| n.contains("for 1 task(s)")));
    }

    #[test]
    fn a_cost_budget_needs_a_price_for_each_model_of_a_task_that_reports_no_cost() {
        let mut capped = task("capped", "codex", Some("gpt-5"), &["unknown"]);
        capped.max_cost_nanos = Some(1_000_000_000);
        let mut default_model = task("default", "codex", None, &[]);
        default_model.max_cost_nanos = Some(1);
        let mut claude = task("claude", "claude", Some("unknown"), &[]);
        claude.max_cost_nanos = Some(1);
        let b = batch(vec![capped, default_model, claude], &[]);
        let errors = crate::validate_batch(&b).expect_err("refused");
        let messages: Vec<(Option<usize>, &str)> = errors
            .iter()
            .map(|e| (e.task, e.message.as_str()))
            .collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(
            messages[0].1.contains("[prices.\"unknown\"]"),
            "{messages:?}"
        );
        assert_eq!(messages[0].0, Some(0));
        assert!(messages[1].1.contains("set `model`"), "{messages:?}");
        // Without a budget nothing is refused: the cost stays unreported.
        let mut free = task("free", "codex", Some("unknown"), &[]);
        free.max_cost_nanos = None;
        assert!(crate::validate_batch(&batch(vec![free], &[])).is_ok());
    }

    #[test]
    fn a_huge_usage_saturates_instead_of_wrapping() {
        let p = ModelPrice::from_usd([1e6, 1e6, 1e6, 1e6]);
        let u = Usage {
            input: u64::MAX,
            output: u64::MAX,
            ..Usage::ZERO
        };
        assert_eq!(p.cost(&u).nanos, u64::MAX);
    }
}
