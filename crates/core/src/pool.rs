//! Shared rate limits (issue 14): pools of attempts keyed by provider or named in the batch.
//!
//! Every attempt of a task belongs to one pool (or none): the task's `pool` when it names one
//! (a `[pools.NAME]` table), else the provider of the attempt's model ([`provider_of`]), else the
//! provider of its agent (Claude Code: `anthropic`, Codex: `openai`); a plain command without a
//! model is in no pool. A pool limits the attempts in flight on top of the run's concurrency:
//! its `concurrency` when configured, else the run's.
//!
//! An adaptive pool (the default) follows the provider's limit (AIMD, like TCP's congestion
//! window). An attempt that ends rate limited shrinks the pool's limit (multiplicative
//! decrease) and stops the pool's launches until the retry-after the agent reported (else
//! [`default_backoff`]). The first refusal of a window halves the limit, but not below the
//! pool's attempts still in flight (the provider has not refused them: they are what it
//! serves); a refusal of an attempt launched before that decrease (same window, sent under the
//! old limit) brings the limit down to what is still in flight. So a burst of 64 against a
//! provider that serves 16 ends at 16, not at 64 / 2^k. Every attempt that ends otherwise earns
//! a credit, and a limit of L grows by one after L credits (additive increase), back to its
//! maximum; a limit that a window's refusals brought below half of what it was (the refusals
//! were seen late, after the served attempts ended) grows by one per success up to that half
//! (TCP's slow start).
//!
//! The pool's state is a fold of the journaled attempts (`AttemptLaunching`, `AttemptFinished`,
//! `AttemptOrphaned`, in `RunState::apply`): nothing about pools is journaled apart, and
//! replay reproduces every decision.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::Timestamp;
use crate::spec::{Batch, Protocol, SpecBody, TaskSpec};

/// A `[pools.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// The most attempts in flight (None: the run's concurrency).
    pub concurrency: Option<u32>,
    /// Whether the pool adapts to rate limits (AIMD); a fixed pool only caps.
    pub adaptive: bool,
}

impl Default for PoolSpec {
    fn default() -> Self {
        PoolSpec {
            concurrency: None,
            adaptive: true,
        }
    }
}

/// The default `max_rate_limits`: how many rate-limited attempts a task may make, apart from
/// `max_retries`.
pub const DEFAULT_MAX_RATE_LIMITS: u32 = 20;

/// The factor of the multiplicative decrease, as a fraction (numerator, denominator).
pub const DECREASE: (u32, u32) = (1, 2);

/// The pause of a pool after a rate limit that came without a retry-after: 1 s, doubled for
/// each rate-limited window in a row, at most 60 s.
pub fn default_backoff(streak: u32) -> Duration {
    let secs = 1u64
        .checked_shl(streak.saturating_sub(1).min(6))
        .unwrap_or(64);
    Duration::from_secs(secs.min(60))
}

/// The provider of a model, from its name:
/// - `PROVIDER/MODEL` (pi's, OpenRouter's and litellm's form): `PROVIDER`;
/// - `claude-*`, `anthropic.*` (Bedrock): `anthropic`;
/// - `gpt-*`, `chatgpt-*`, `o1`, `o3`, `o4` (and `o1-*` ...), `codex-*`, `davinci-*`: `openai`;
/// - `gemini-*`, `gemma-*`: `google`;
/// - `mistral-*`, `codestral-*`, `devstral-*`, `magistral-*`, `ministral-*`: `mistral`;
/// - `grok-*`: `xai`; `deepseek-*`: `deepseek`; `command-*`: `cohere`;
/// - anything else: None (the agent's provider, if known, is the pool).
pub fn provider_of(model: &str) -> Option<String> {
    provider_in(&model.trim().to_ascii_lowercase()).map(Cow::into_owned)
}

/// [`provider_of`] of a model already trimmed and lowercase, borrowed from it where it can.
fn provider_in(m: &str) -> Option<Cow<'_, str>> {
    if let Some((provider, rest)) = m.split_once('/')
        && !provider.is_empty()
        && !rest.is_empty()
    {
        return Some(Cow::Borrowed(provider));
    }
    let starts = |ps: &[&str]| ps.iter().any(|p| m.starts_with(p));
    let family = |names: &[&str]| {
        names.iter().any(|n| {
            m == *n
                || m.strip_prefix(n)
                    .is_some_and(|r| r.starts_with('-') || r.starts_with('.'))
        })
    };
    let provider = if starts(&["claude", "anthropic."]) {
        "anthropic"
    } else if starts(&["gpt-", "gpt4", "chatgpt", "codex-", "davinci"])
        || family(&["o1", "o3", "o4"])
    {
        "openai"
    } else if starts(&["gemini", "gemma"]) {
        "google"
    } else if starts(&["mistral", "codestral", "devstral", "magistral", "ministral"]) {
        "mistral"
    } else if starts(&["grok"]) {
        "xai"
    } else if starts(&["deepseek"]) {
        "deepseek"
    } else if starts(&["command-"]) {
        "cohere"
    } else {
        return None;
    };
    Some(Cow::Borrowed(provider))
}

/// [`provider_of`] without allocating when the model's name is already trimmed and lowercase
/// (as nearly all are): replay asks for the pool of every attempt's launch and end.
fn provider_ref(model: &str) -> Option<Cow<'_, str>> {
    // Trimming is a no-op when both ends are visible ASCII (whitespace is either ASCII or not).
    let bytes = model.as_bytes();
    let plain = bytes.first().is_some_and(u8::is_ascii_graphic)
        && bytes.last().is_some_and(u8::is_ascii_graphic)
        && !bytes.iter().any(u8::is_ascii_uppercase);
    if plain {
        provider_in(model)
    } else {
        provider_of(model).map(Cow::Owned)
    }
}

/// The pool of an attempt of `spec` on `model` (see the module's doc).
pub fn pool_of(batch: &Batch, spec: &TaskSpec, model: Option<&str>) -> Option<String> {
    pool_ref(batch, spec, model).map(Cow::into_owned)
}

/// [`pool_of`], borrowed where it can be (no allocation for a pool found by a name).
pub(crate) fn pool_ref<'a>(
    batch: &'a Batch,
    spec: &'a TaskSpec,
    model: Option<&'a str>,
) -> Option<Cow<'a, str>> {
    if let Some(p) = &spec.pool {
        return Some(Cow::Borrowed(p));
    }
    if let Some(p) = model.and_then(provider_ref) {
        return Some(p);
    }
    let profile = batch.agents.get(&spec.agent)?;
    match profile.protocol {
        Protocol::ClaudeStreamJson => Some(Cow::Borrowed("anthropic")),
        Protocol::CodexJson => Some(Cow::Borrowed("openai")),
        _ => None,
    }
}

/// Every pool the batch's tasks may use (each task's primary and fallback models), with the
/// configured ones.
pub fn pools_used(batch: &Batch) -> BTreeMap<String, Vec<usize>> {
    let mut used: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, spec) in batch.tasks.iter().enumerate() {
        for p in pools_of(batch, spec) {
            let tasks = used.entry(p).or_default();
            if tasks.last() != Some(&i) {
                tasks.push(i);
            }
        }
    }
    used
}

/// The names of [`pools_used`], without the tasks: a task's pools are its body's, so the tasks
/// that share a body (see `TaskSpec`) are looked at once (a run's start, replayed, looked at
/// every task of 125,000 sharing one body: 0.25 G instructions).
pub fn pool_names(batch: &Batch) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut last: Option<&Arc<SpecBody>> = None;
    for spec in &batch.tasks {
        if last.is_some_and(|b| Arc::ptr_eq(b, &spec.body)) {
            continue;
        }
        last = Some(&spec.body);
        names.extend(pools_of(batch, spec));
    }
    names
}

/// The pools of a task's primary and fallback models, in order, a run of one pool once.
fn pools_of(batch: &Batch, spec: &TaskSpec) -> Vec<String> {
    let models = std::iter::once(spec.model.as_deref())
        .chain(spec.fallback_models.iter().map(|m| Some(m.as_str())));
    let mut mine: Vec<String> = models.filter_map(|m| pool_of(batch, spec, m)).collect();
    mine.dedup();
    mine
}

/// A pool's state: a fold of its attempts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolState {
    /// The configured concurrency (None: the run's).
    pub configured: Option<u32>,
    /// Whether it adapts.
    pub adaptive: bool,
    /// The limit the rate limits left it at (None: its maximum).
    pub limit: Option<u32>,
    /// Credits towards the next increase.
    pub credit: u32,
    /// Half the limit at the last decrease: below it, the limit grows by one per success
    /// (TCP's slow start), at or above it by one per `limit` successes.
    pub threshold: u32,
    /// Its attempts in flight.
    pub in_flight: u32,
    /// No launch before this time (a rate limit's retry-after).
    pub backoff_until: Option<Timestamp>,
    /// When the limit was last decreased.
    pub decreased_at: Option<Timestamp>,
    /// Rate-limited windows in a row (reset by an attempt that was not rate limited).
    pub streak: u32,
    /// How many of its attempts were rate limited.
    pub rate_limited: u64,
    /// How many of its attempts ended otherwise.
    pub succeeded: u64,
}

impl PoolState {
    /// A pool as configured.
    pub fn new(spec: Option<&PoolSpec>) -> PoolState {
        let spec = spec.cloned().unwrap_or_default();
        PoolState {
            configured: spec.concurrency,
            adaptive: spec.adaptive,
            ..PoolState::default()
        }
    }

    /// Its maximum when the run's concurrency is `run`.
    pub fn max(&self, run: u32) -> u32 {
        self.configured.unwrap_or(run).max(1)
    }

    /// Its limit now, when the run's concurrency is `run`.
    pub fn limit(&self, run: u32) -> u32 {
        let max = self.max(run);
        self.limit.map_or(max, |l| l.min(max)).max(1)
    }

    /// Whether it holds back a launch at `now` with `more` of its launches already planned.
    pub fn holds(&self, now: Timestamp, run: u32, more: u32) -> bool {
        self.backing_off(now) || self.in_flight.saturating_add(more) >= self.limit(run)
    }

    /// Whether it is backing off at `now`.
    pub fn backing_off(&self, now: Timestamp) -> bool {
        self.backoff_until.is_some_and(|t| t > now)
    }

    /// An attempt of the pool launched.
    pub(crate) fn launched(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
    }

    /// An attempt of the pool, launched at `launched_at`, ended at `at` (`rate_limited` with
    /// the retry-after it reported, or not); `run` is the run's concurrency.
    pub(crate) fn ended(
        &mut self,
        at: Timestamp,
        launched_at: Timestamp,
        rate_limited: Option<Option<Duration>>,
        run: u32,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(retry_after) = rate_limited else {
            self.succeeded += 1;
            if !self.adaptive {
                return;
            }
            self.streak = 0;
            if let Some(l) = self.limit {
                self.credit += 1;
                if l < self.threshold || self.credit >= l {
                    self.credit = 0;
                    let l = l + 1;
                    self.limit = (l < self.max(run)).then_some(l);
                }
            }
            return;
        };
        self.rate_limited += 1;
        if !self.adaptive {
            return;
        }
        // The pool's attempts still in flight are those the provider has not refused (so
        // far): the limit comes down to them, by half at most per window; a later refusal of
        // the same window brings it down to what is still in flight.
        let l = self.limit(run);
        let served = self.in_flight.clamp(1, l);
        let fresh = self.decreased_at.is_none_or(|d| launched_at >= d);
        if fresh {
            self.threshold = (l * DECREASE.0 / DECREASE.1).max(1);
            self.limit = Some(self.threshold.max(served));
            self.credit = 0;
            self.decreased_at = Some(at);
            self.streak = self.streak.saturating_add(1);
        } else {
            self.limit = Some(served);
        }
        let pause = retry_after.unwrap_or_else(|| default_backoff(self.streak.max(1)));
        let until = at.plus(pause);
        if self.backoff_until.is_none_or(|b| b < until) {
            self.backoff_until = Some(until);
        }
    }

    /// An attempt of the pool was orphaned (resume found it): it is no longer in flight.
    pub(crate) fn orphaned(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// The pool holding back task `task` at `now`: the task is ready to launch (queued, or a
/// retry that is due) and its next attempt's pool is full or backing off. None otherwise.
pub fn waiting_for_pool(
    state: &crate::state::RunState,
    task: crate::ids::TaskId,
    now: Timestamp,
) -> Option<&str> {
    use crate::state::TaskState;
    let (batch, rec, spec) = (state.batch.as_ref()?, state.task(task)?, state.spec(task)?);
    let model = match &rec.state {
        TaskState::Queued { .. } => {
            let next = crate::ids::Attempt(rec.attempts.len() as u32 + 1);
            crate::decide::model_for_attempt(spec, next)
        }
        TaskState::Retrying {
            model, not_before, ..
        } if *not_before <= now => model.clone(),
        _ => return None,
    };
    let name = pool_of(batch, spec, model.as_deref())?;
    let run = state
        .control
        .concurrency
        .unwrap_or(batch.config.concurrency);
    let (name, pool) = state.pools.get_key_value(&name)?;
    pool.holds(now, run, 0).then_some(name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The borrowed provider is the allocated one, whatever the name (case, spaces,
        /// slashes, families).
        #[test]
        fn the_borrowed_provider_is_the_provider(
            model in "[ \t]?(Claude|claude|GPT-|gpt-|o1|O3|o4x|gemini|Mistral|grok|deepseek|command-|x|/)?[a-zA-Z0-9./ -]{0,12}[ \t]?",
        ) {
            proptest::prop_assert_eq!(
                provider_ref(&model).map(Cow::into_owned),
                provider_of(&model)
            );
        }
    }

    #[test]
    fn the_borrowed_provider_borrows_a_plain_name_and_lowercases_others() {
        assert!(matches!(
            provider_ref("anthropic/claude"),
            Some(Cow::Borrowed("anthropic"))
        ));
        assert!(matches!(
            provider_ref("gpt-5"),
            Some(Cow::Borrowed("openai"))
        ));
        assert_eq!(provider_ref(" OpenAI/GPT-5").as_deref(), Some("openai"));
        assert_eq!(provider_ref("llama"), None);
    }

    #[test]
    fn the_pool_names_are_the_pools_used_whether_bodies_are_shared_or_not() {
        let task = |label: &str, model: &str, fallback: &[&str]| {
            let mut t = TaskSpec::new(label, "/w");
            t.model = Some(model.into());
            t.fallback_models = fallback.iter().map(|m| (*m).to_owned()).collect();
            t
        };
        let mut batch = Batch {
            tasks: vec![
                task("a", "anthropic/x", &["openai/y"]),
                task("b", "anthropic/x", &["openai/y"]),
                task("c", "google/z", &[]),
                task("d", "anthropic/x", &["openai/y"]),
                task("e", "mock/m", &["anthropic/x"]),
            ],
            agents: crate::spec::AgentProfile::builtins(),
            config: crate::spec::RunConfig::default(),
            source: "b.toml".into(),
        };
        let used: BTreeSet<String> = pools_used(&batch).into_keys().collect();
        assert_eq!(used.len(), 4, "{used:?}");
        assert_eq!(pool_names(&batch), used);
        batch.share_bodies();
        assert!(Arc::ptr_eq(&batch.tasks[0].body, &batch.tasks[1].body));
        assert_eq!(pool_names(&batch), used);
    }

    #[test]
    fn providers_come_from_model_names() {
        for (model, provider) in [
            ("anthropic/claude-sonnet-4", Some("anthropic")),
            ("openrouter/meta-llama/llama-3", Some("openrouter")),
            ("mock/mock-model", Some("mock")),
            ("claude-sonnet-4-5", Some("anthropic")),
            ("claude-3-5-haiku-latest", Some("anthropic")),
            ("anthropic.claude-v2", Some("anthropic")),
            ("gpt-5-codex", Some("openai")),
            ("o3", Some("openai")),
            ("o4-mini", Some("openai")),
            ("gemini-2.5-pro", Some("google")),
            ("devstral-small", Some("mistral")),
            ("grok-4", Some("xai")),
            ("deepseek-chat", Some("deepseek")),
            ("qwen3-coder", None),
            ("o3x", None),
            ("/x", None),
        ] {
            assert_eq!(provider_of(model).as_deref(), provider, "{model}");
        }
    }

    #[test]
    fn a_rate_limit_shrinks_the_limit_to_what_is_served_and_successes_grow_it_back() {
        let mut p = PoolState::new(Some(&PoolSpec {
            concurrency: Some(8),
            adaptive: true,
        }));
        for _ in 0..8 {
            p.launched();
        }
        let t = |ms| Timestamp(ms);
        // The first 429: halved, but not below the 7 still in flight.
        p.ended(t(100), t(0), Some(Some(Duration::from_secs(2))), 64);
        assert_eq!(p.limit(64), 7);
        assert_eq!(p.backoff_until, Some(t(2100)));
        // More refusals of the same window: down to what is still in flight.
        for left in [6, 5, 4, 3] {
            p.ended(t(150), t(0), Some(None), 64);
            assert_eq!(p.limit(64), left, "same window");
        }
        assert!(p.holds(t(2000), 64, 0), "backing off");
        assert_eq!(p.in_flight, 3);
        // Launched after the decrease: below half the limit of before (4), +1 per success;
        // from there, +1 per `limit` successes.
        p.ended(t(3000), t(2500), None, 64);
        assert_eq!(p.limit(64), 4);
        p.ended(t(3000), t(2500), None, 64);
        assert_eq!(p.limit(64), 4);
        // A new window halves (4 / 2), nothing being left in flight.
        p.ended(t(3000), t(2500), Some(None), 64);
        assert_eq!(p.limit(64), 2);
        assert_eq!(
            p.backoff_until,
            Some(t(4000)),
            "1 s: successes came between the two windows"
        );
        // Successes: +1 per `limit` of them.
        for _ in 0..3 {
            p.launched();
        }
        p.ended(t(6000), t(5500), None, 64);
        assert_eq!(p.limit(64), 2);
        p.ended(t(6000), t(5500), None, 64);
        assert_eq!(p.limit(64), 3);
        p.ended(t(6000), t(5500), None, 64);
        assert_eq!(p.limit(64), 3);
        assert_eq!((p.rate_limited, p.succeeded), (6, 5));
    }

    #[test]
    fn a_fixed_pool_only_caps() {
        let mut p = PoolState::new(Some(&PoolSpec {
            concurrency: Some(3),
            adaptive: false,
        }));
        p.launched();
        p.ended(Timestamp(10), Timestamp(0), Some(None), 64);
        assert_eq!((p.limit(64), p.backoff_until, p.rate_limited), (3, None, 1));
        for _ in 0..3 {
            p.launched();
        }
        assert!(p.holds(Timestamp(20), 64, 0));
        assert!(!PoolState::new(None).holds(Timestamp(0), 4, 3));
        assert!(
            PoolState::new(None).holds(Timestamp(0), 4, 4),
            "the run's concurrency"
        );
    }
}
