//! Format v2: the v1 schema plus extension structs, one per stored core struct that grows.
//!
//! A v2 value is its v1 value plus an `ext`: `TaskSpecV2 { v1: TaskSpecV1, ext: TaskExtV2 }` and
//! so on. The v1 half is read by the v1 conversion, which gives every field added since v1 its
//! default; the ext half then sets those fields from what was stored (`apply`). So a v1 record
//! and a v2 record read through the same code, and an old journal keeps reading.
//!
//! Rules for this file:
//! - to store a new field of a core struct, append it at the END of the matching ext struct, with
//!   its line in `of` and in `apply`, and give it its default for v1 records in the v1 conversion
//!   (`stored/mod.rs`, the only edit allowed there);
//! - every ext struct is stored as a `Grow`: its fields as one byte string, so that fields may
//!   be appended to it forever (a record written before a field existed reads it as its
//!   default, which is why each ext struct is `#[serde(default)]`); a struct nested in an ext
//!   that may grow is wrapped in `Grow` too;
//! - once the v2 fixture is committed (`crates/journal/tests/fixtures/v2`), nothing else of v2
//!   changes: no field removed, reordered or retyped, no variant of `StoredEvent` changed (new
//!   ones appended); a change of that kind gets a v3.
//!
//! `sortie export` flattens each `{v1, ext}` pair into one object (see `export`), so users see
//! one set of fields whatever the version.

use std::collections::BTreeMap;

use serde::de::{DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sortie_core::spec::{AgentProfile, Batch, RunConfig};
use sortie_core::{AttemptOutcome, TaskResult, TaskSpec};

pub(crate) use super::v2_run::{BudgetLimitV2, RunConfigExtV2};
pub(crate) use super::v2_task::{ExecutorV2, NeedsModeV2, PermissionsV2, SandboxV2};
use super::{AgentProfileV1, AttemptOutcomeV1, BatchV1, RunConfigV1, TaskResultV1, TaskSpecV1};

/// The fields of `TaskSpec` added since v1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct TaskExtV2 {
    // #10: attempts that outlive sortie.
    max_orphans: u32,
    supervise: bool,
    // #11
    executor: ExecutorV2,
    // Issue 13: permissions, tools, allow_denials, system_prompt, thinking, transient_on.
    permissions: PermissionsV2,
    tools: Vec<String>,
    allow_denials: bool,
    system_prompt: Option<String>,
    thinking: Option<String>,
    transient_on: Vec<String>,
    // Issue 14: shared rate limits.
    pool: Option<String>,
    max_rate_limits: u32,
    // #15
    on_task_end: Option<String>,

    // #13: roles and sessions.
    role: Option<String>,
    session: Option<String>,
    // Issue 13: structured results.
    output_schema: Option<String>,
    // #37: an attempt timeout retried.
    retry_timeouts: bool,
    // #33: verified results (a record without them reads no check).
    verify: Option<Vec<String>>,
    /// None: the default (a record from before the field).
    verify_timeout: Option<std::time::Duration>,
    verify_rounds: u32,
    /// "first-pass" or "best-score".
    pick: Option<String>,
    sample_of: Option<String>,
    // #33: a judge over samples.
    needs_mode: NeedsModeV2,
    // #34: the kernel sandbox.
    sandbox: SandboxV2,
    sandbox_write: Vec<String>,
    sandbox_read: Vec<String>,
    sandbox_hosts: Vec<String>,
}

impl TaskExtV2 {
    pub(crate) fn of(t: &TaskSpec) -> Self {
        TaskExtV2 {
            max_orphans: t.max_orphans,
            supervise: t.supervise,
            executor: (&t.executor).into(),
            permissions: t.permissions.into(),
            tools: t.tools.clone(),
            allow_denials: t.allow_denials,
            system_prompt: t.system_prompt.clone(),
            thinking: t.thinking.clone(),
            transient_on: t.transient_on.clone(),
            pool: t.pool.clone(),
            max_rate_limits: t.max_rate_limits,
            on_task_end: t.on_task_end.clone(),

            role: t.role.clone(),
            session: t.session.clone(),
            output_schema: t.output_schema.clone(),
            retry_timeouts: t.retry_timeouts,
            verify: t.verify.clone(),
            verify_timeout: Some(t.verify_timeout),
            verify_rounds: t.verify_rounds,
            pick: t.pick.map(|p| p.as_str().to_owned()),
            sample_of: t.sample_of.clone(),
            // #33: a judge over samples.
            needs_mode: t.needs_mode.into(),
            // #34: the kernel sandbox.
            sandbox: t.sandbox.into(),
            sandbox_write: t.sandbox_write.clone(),
            sandbox_read: t.sandbox_read.clone(),
            sandbox_hosts: t.sandbox_hosts.clone(),
        }
    }
    pub(crate) fn apply(self, t: &mut TaskSpec) -> Result<(), String> {
        t.max_orphans = self.max_orphans;
        t.supervise = self.supervise;
        t.executor = self.executor.into();
        t.permissions = self.permissions.into();
        t.tools = self.tools;
        t.allow_denials = self.allow_denials;
        t.system_prompt = self.system_prompt;
        t.thinking = self.thinking;
        t.transient_on = self.transient_on;
        t.pool = self.pool;
        t.max_rate_limits = self.max_rate_limits;
        t.on_task_end = self.on_task_end;

        t.role = self.role;
        t.session = self.session;
        t.output_schema = self.output_schema;
        t.retry_timeouts = self.retry_timeouts;
        t.verify = self.verify;
        if let Some(d) = self.verify_timeout {
            t.verify_timeout = d;
        }
        t.verify_rounds = self.verify_rounds;
        t.pick = match self.pick.as_deref() {
            None => None,
            Some(name) => Some(
                sortie_core::verify::Pick::parse(name)
                    .ok_or_else(|| format!("unknown pick {name:?}"))?,
            ),
        };
        t.sample_of = self.sample_of;
        // #33: a judge over samples.
        t.needs_mode = self.needs_mode.into();
        // #34: the kernel sandbox.
        t.sandbox = self.sandbox.into();
        t.sandbox_write = self.sandbox_write;
        t.sandbox_read = self.sandbox_read;
        t.sandbox_hosts = self.sandbox_hosts;
        Ok(())
    }
}

/// Mirrors `sortie_core::Denial`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DenialV2 {
    tool: String,
    count: u32,
}

/// The fields of `AgentProfile` added since v1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct AgentExtV2 {
    // #10: attempts that outlive sortie.
    supervise: bool,
}

impl AgentExtV2 {
    pub(crate) fn of(p: &AgentProfile) -> Self {
        AgentExtV2 {
            supervise: p.supervise,
        }
    }
    pub(crate) fn apply(self, p: &mut AgentProfile) -> Result<(), String> {
        p.supervise = self.supervise;
        Ok(())
    }
}

/// The fields of `Batch` added since v1 (batch-wide tables beside tasks and agents).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct BatchExtV2 {}

impl BatchExtV2 {
    pub(crate) fn of(_b: &Batch) -> Self {
        BatchExtV2 {}
    }
    pub(crate) fn apply(self, _b: &mut Batch) -> Result<(), String> {
        Ok(())
    }
}

/// The fields of `AttemptOutcome` added since v1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct OutcomeExtV2 {
    // Issue 13: the tool calls the agent's permissions denied.
    denials: Vec<DenialV2>,
    // Issue 14: shared rate limits.
    rate_limited: bool,
    retry_after_ms: Option<u64>,
    // Issue 13: structured results.
    result: Option<String>,
}

impl OutcomeExtV2 {
    pub(crate) fn of(o: &AttemptOutcome) -> Self {
        OutcomeExtV2 {
            denials: o
                .denials
                .iter()
                .map(|d| DenialV2 {
                    tool: d.tool.clone(),
                    count: d.count,
                })
                .collect(),
            rate_limited: o.rate_limited,
            retry_after_ms: o.retry_after_ms,
            result: o.result.clone(),
        }
    }
    pub(crate) fn apply(self, o: &mut AttemptOutcome) -> Result<(), String> {
        o.denials = self
            .denials
            .into_iter()
            .map(|d| sortie_core::Denial {
                tool: d.tool,
                count: d.count,
            })
            .collect();
        o.rate_limited = self.rate_limited;
        o.retry_after_ms = self.retry_after_ms;
        o.result = self.result;
        Ok(())
    }
}

/// The fields of `TaskResult` added since v1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ResultExtV2 {
    // Issue 13: structured results.
    result: Option<String>,
}

impl ResultExtV2 {
    pub(crate) fn of(r: &TaskResult) -> Self {
        ResultExtV2 {
            result: r.result.clone(),
        }
    }
    pub(crate) fn apply(self, r: &mut TaskResult) -> Result<(), String> {
        r.result = self.result;
        Ok(())
    }
}

/// A v2 value: the v1 value and the fields added since.
///
/// Stored (bincode, not human-readable) as the pair; printed (JSON) as one object holding the
/// fields of both, in order, so that `sortie export` shows one flat record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct V2<B, E> {
    /// The value as v1 stored it.
    pub(crate) v1: B,
    /// The fields added since v1.
    pub(crate) ext: E,
}

impl<B: Serialize, E: Serialize> Serialize for V2<B, E> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The stored form: the two halves in order.
        #[derive(Serialize)]
        struct Pair<'a, B, E> {
            v1: &'a B,
            ext: Grow<&'a E>,
        }
        /// The printed form: one object.
        #[derive(Serialize)]
        struct Flat<'a, B, E> {
            #[serde(flatten)]
            v1: &'a B,
            #[serde(flatten)]
            ext: &'a E,
        }
        if serializer.is_human_readable() {
            Flat {
                v1: &self.v1,
                ext: &self.ext,
            }
            .serialize(serializer)
        } else {
            Pair {
                v1: &self.v1,
                ext: Grow(&self.ext),
            }
            .serialize(serializer)
        }
    }
}

/// The stored form of a v2 value, read.
#[derive(Deserialize)]
#[serde(bound(deserialize = "B: Deserialize<'de>, E: DeserializeOwned"))]
struct PairDe<B, E> {
    v1: B,
    ext: Grow<E>,
}

impl<'de, B: Deserialize<'de>, E: DeserializeOwned> Deserialize<'de> for V2<B, E> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let PairDe { v1, ext: Grow(ext) } = PairDe::deserialize(deserializer)?;
        Ok(V2 { v1, ext })
    }
}

/// A struct that later builds may extend by appending fields: stored as one length-prefixed
/// byte string of its fields (`codec::encode_grow`), so that a record written before a field
/// existed reads that field as its default, and a record with fields this build does not know is
/// refused rather than half read. Printed (JSON) as the struct itself.
///
/// Every ext struct is stored this way (see `V2`), and so is any struct nested in one that may
/// grow. The struct must be `#[serde(default)]`, with the default meaning "written before
/// this field existed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Grow<T>(pub(crate) T);

impl<T: Serialize> Serialize for Grow<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            self.0.serialize(serializer)
        } else {
            let bytes = crate::codec::encode_grow(&self.0).map_err(serde::ser::Error::custom)?;
            serializer.serialize_bytes(&bytes)
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Grow<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Reads the byte string and decodes the struct from it.
        struct Bytes<T>(std::marker::PhantomData<T>);
        impl<T: DeserializeOwned> Visitor<'_> for Bytes<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the bytes of an extension struct")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<T, E> {
                crate::codec::decode_grow(v).map_err(E::custom)
            }
        }
        if deserializer.is_human_readable() {
            T::deserialize(deserializer).map(Grow)
        } else {
            deserializer
                .deserialize_bytes(Bytes(std::marker::PhantomData))
                .map(Grow)
        }
    }
}

/// Mirrors `sortie_core::TaskSpec`, v2.
pub(crate) type TaskSpecV2 = V2<TaskSpecV1, TaskExtV2>;
/// Mirrors `sortie_core::spec::AgentProfile`, v2.
pub(crate) type AgentProfileV2 = V2<AgentProfileV1, AgentExtV2>;
/// Mirrors `sortie_core::spec::RunConfig`, v2.
pub(crate) type RunConfigV2 = V2<RunConfigV1, RunConfigExtV2>;
/// Mirrors `sortie_core::AttemptOutcome`, v2.
pub(crate) type AttemptOutcomeV2 = V2<AttemptOutcomeV1, OutcomeExtV2>;
/// Mirrors `sortie_core::TaskResult`, v2.
pub(crate) type TaskResultV2 = V2<TaskResultV1, ResultExtV2>;

impl From<&TaskSpec> for TaskSpecV2 {
    fn from(t: &TaskSpec) -> Self {
        V2 {
            v1: t.into(),
            ext: TaskExtV2::of(t),
        }
    }
}

impl TryFrom<TaskSpecV2> for TaskSpec {
    type Error = String;
    fn try_from(t: TaskSpecV2) -> Result<Self, String> {
        let mut spec = TaskSpec::try_from(t.v1)?;
        t.ext.apply(&mut spec)?;
        Ok(spec)
    }
}

impl From<&AgentProfile> for AgentProfileV2 {
    fn from(p: &AgentProfile) -> Self {
        V2 {
            v1: p.into(),
            ext: AgentExtV2::of(p),
        }
    }
}

impl TryFrom<AgentProfileV2> for AgentProfile {
    type Error = String;
    fn try_from(p: AgentProfileV2) -> Result<Self, String> {
        let mut profile = AgentProfile::from(p.v1);
        p.ext.apply(&mut profile)?;
        Ok(profile)
    }
}

impl From<&AttemptOutcome> for AttemptOutcomeV2 {
    fn from(o: &AttemptOutcome) -> Self {
        V2 {
            v1: o.into(),
            ext: OutcomeExtV2::of(o),
        }
    }
}

impl TryFrom<AttemptOutcomeV2> for AttemptOutcome {
    type Error = String;
    fn try_from(o: AttemptOutcomeV2) -> Result<Self, String> {
        let mut outcome = AttemptOutcome::from(o.v1);
        o.ext.apply(&mut outcome)?;
        Ok(outcome)
    }
}

impl From<&TaskResult> for TaskResultV2 {
    fn from(r: &TaskResult) -> Self {
        V2 {
            v1: r.into(),
            ext: ResultExtV2::of(r),
        }
    }
}

impl TryFrom<TaskResultV2> for TaskResult {
    type Error = String;
    fn try_from(r: TaskResultV2) -> Result<Self, String> {
        let mut result = TaskResult::from(r.v1);
        r.ext.apply(&mut result)?;
        Ok(result)
    }
}

/// The v1 fields of `Batch`, with its parts in v2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchBodyV2 {
    tasks: Vec<TaskSpecV2>,
    agents: BTreeMap<String, AgentProfileV2>,
    config: RunConfigV2,
    source: String,
}

/// Mirrors `sortie_core::Batch`, v2.
pub(crate) type BatchV2 = V2<BatchBodyV2, BatchExtV2>;

/// A batch as `StoredEvent::RunStartedShared` stores it: like [`BatchBodyV2`], but with each
/// distinct task body stored once (as a task spec with an empty label and no prompt) and, per
/// task, its label, its prompt and the index of its body. A batch of 100,000 generated tasks
/// holds a handful of distinct bodies: stored whole, they were nearly all of its record's bytes
/// and of the time to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SharedBatchBodyV2 {
    bodies: Vec<TaskSpecV2>,
    tasks: Vec<TaskRefV2>,
    parts: BatchPartsV2,
}

/// One task of a [`SharedBatchBodyV2`]: what is its own, and the index of its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskRefV2 {
    label: String,
    prompt: Option<String>,
    body: u32,
}

/// The parts of a stored batch beside its tasks (bincode stores a nested struct as its fields
/// in order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchPartsV2 {
    agents: BTreeMap<String, AgentProfileV2>,
    config: RunConfigV2,
    source: String,
}

/// Mirrors `sortie_core::Batch`, v2, each distinct task body once.
pub(crate) type SharedBatchV2 = V2<SharedBatchBodyV2, BatchExtV2>;

/// The parts of `b` beside its tasks, stored.
fn parts_of(b: &Batch) -> BatchPartsV2 {
    BatchPartsV2 {
        agents: b
            .agents
            .iter()
            .map(|(k, v)| (k.clone(), v.into()))
            .collect(),
        config: V2 {
            v1: RunConfigV1::from(&b.config),
            ext: RunConfigExtV2::of(&b.config),
        },
        source: b.source.clone(),
    }
}

/// The batch of `tasks` (decoded) with its other parts as stored.
fn batch_of(tasks: Vec<TaskSpec>, parts: BatchPartsV2, ext: BatchExtV2) -> Result<Batch, String> {
    let mut config = RunConfig::from(parts.config.v1);
    parts.config.ext.apply(&mut config)?;
    // Through the v1 conversion, so that fields added to `Batch` since v1 get their v1
    // defaults in one place; the parts are then set from their v2 forms.
    let mut batch = Batch::try_from(BatchV1 {
        tasks: Vec::new(),
        agents: BTreeMap::new(),
        config: (&config).into(),
        source: parts.source,
    })?;
    batch.config = config;
    batch.tasks = tasks;
    batch.agents = parts
        .agents
        .into_iter()
        .map(|(k, v)| Ok((k, v.try_into()?)))
        .collect::<Result<_, String>>()?;
    ext.apply(&mut batch)?;
    Ok(batch)
}

impl From<&Batch> for BatchV2 {
    fn from(b: &Batch) -> Self {
        let BatchPartsV2 {
            agents,
            config,
            source,
        } = parts_of(b);
        let tasks = b.tasks.iter().map(Into::into).collect();
        V2 {
            v1: BatchBodyV2 {
                tasks,
                agents,
                config,
                source,
            },
            ext: BatchExtV2::of(b),
        }
    }
}

impl TryFrom<BatchV2> for Batch {
    type Error = String;
    fn try_from(b: BatchV2) -> Result<Self, String> {
        let BatchBodyV2 {
            tasks,
            agents,
            config,
            source,
        } = b.v1;
        // Tasks alike share one body as they are decoded (this form stores each whole).
        let mut sharer = sortie_core::BodySharer::default();
        let tasks = tasks
            .into_iter()
            .map(|t| {
                let mut spec = TaskSpec::try_from(t)?;
                sharer.share(&mut spec);
                Ok(spec)
            })
            .collect::<Result<_, String>>()?;
        let parts = BatchPartsV2 {
            agents,
            config,
            source,
        };
        batch_of(tasks, parts, b.ext)
    }
}

impl From<&Batch> for SharedBatchV2 {
    fn from(b: &Batch) -> Self {
        let (bodies, index) = b.body_table();
        let bodies = bodies
            .into_iter()
            .map(|body| {
                let spec = TaskSpec {
                    label: String::new(),
                    prompt: None,
                    body: std::sync::Arc::clone(body),
                };
                TaskSpecV2::from(&spec)
            })
            .collect();
        let tasks = b
            .tasks
            .iter()
            .zip(index)
            .map(|(t, body)| TaskRefV2 {
                label: t.label.clone(),
                prompt: t.prompt.clone(),
                body,
            })
            .collect();
        V2 {
            v1: SharedBatchBodyV2 {
                bodies,
                tasks,
                parts: parts_of(b),
            },
            ext: BatchExtV2::of(b),
        }
    }
}

impl TryFrom<SharedBatchV2> for Batch {
    type Error = String;
    fn try_from(b: SharedBatchV2) -> Result<Self, String> {
        let SharedBatchBodyV2 {
            bodies,
            tasks,
            parts,
        } = b.v1;
        let bodies = bodies
            .into_iter()
            .map(|t| Ok(TaskSpec::try_from(t)?.body))
            .collect::<Result<Vec<_>, String>>()?;
        let tasks = tasks
            .into_iter()
            .map(|t| {
                let shared = bodies.get(t.body as usize).ok_or_else(|| {
                    format!("task {} names body {} of {}", t.label, t.body, bodies.len())
                })?;
                Ok(TaskSpec {
                    label: t.label,
                    prompt: t.prompt,
                    body: std::sync::Arc::clone(shared),
                })
            })
            .collect::<Result<_, String>>()?;
        batch_of(tasks, parts, b.ext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An extension as an earlier build wrote it.
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(default)]
    struct Before {
        a: u32,
        b: Option<String>,
    }

    /// The same extension after a build appended two fields.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default)]
    struct After {
        a: u32,
        b: Option<String>,
        c: Vec<String>,
        d: u8,
    }

    impl Default for After {
        fn default() -> Self {
            After {
                a: 0,
                b: None,
                c: vec![],
                d: 80,
            }
        }
    }

    fn stored<T: Serialize>(v: T) -> Vec<u8> {
        bincode::serde::encode_to_vec((Grow(v), 7u8), bincode::config::standard()).unwrap()
    }

    fn read<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, u8), String> {
        bincode::serde::decode_from_slice::<(Grow<T>, u8), _>(bytes, bincode::config::standard())
            .map(|((Grow(v), tail), _)| (v, tail))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_field_appended_later_reads_as_its_default_from_an_older_record() {
        let old = stored(Before {
            a: 3,
            b: Some("x".into()),
        });
        let (v, tail) = read::<After>(&old).unwrap();
        assert_eq!(
            v,
            After {
                a: 3,
                b: Some("x".into()),
                c: vec![],
                d: 80
            }
        );
        assert_eq!(tail, 7, "what follows the extension is read from its place");
    }

    #[test]
    fn fields_this_build_does_not_know_are_refused_not_dropped() {
        let new = stored(After {
            a: 3,
            b: None,
            c: vec!["y".into()],
            d: 1,
        });
        let err = read::<Before>(&new).unwrap_err();
        assert!(err.contains("this build does not know"), "{err}");
    }

    #[test]
    fn json_shows_the_extension_as_the_struct_itself() {
        let json = serde_json::to_value(Grow(Before { a: 1, b: None })).unwrap();
        assert_eq!(json, serde_json::json!({"a": 1, "b": null}));
    }

    /// Nine tasks whose bodies take turns among three directories, the fifth with a body of
    /// its own: four distinct bodies.
    fn four_bodies() -> Batch {
        let mut batch = Batch {
            tasks: (0..9)
                .map(|i| TaskSpec {
                    prompt: Some(format!("prompt {i}")),
                    ..TaskSpec::new(format!("t{i}"), ["/a", "/b", "/c"][i % 3])
                })
                .collect(),
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "batch.toml".into(),
        };
        batch.tasks[4].max_retries = 9;
        batch
    }

    fn encode<T: Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap()
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> T {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .unwrap()
            .0
    }

    #[test]
    fn a_shared_batch_stores_each_distinct_body_once_and_reads_back_equal_and_shared() {
        let batch = four_bodies();
        let stored = SharedBatchV2::from(&batch);
        assert_eq!(stored.v1.bodies.len(), 4);
        let bytes = encode(&stored);
        let back = Batch::try_from(decode::<SharedBatchV2>(&bytes)).unwrap();
        assert_eq!(back, batch);
        assert!(std::sync::Arc::ptr_eq(
            &back.tasks[1].body,
            &back.tasks[7].body
        ));
        assert!(!std::sync::Arc::ptr_eq(
            &back.tasks[1].body,
            &back.tasks[4].body
        ));
        assert!(bytes.len() < encode(&BatchV2::from(&batch)).len());
    }

    #[test]
    fn a_body_index_past_the_table_is_an_error_not_a_panic() {
        let mut stored = SharedBatchV2::from(&four_bodies());
        stored.v1.tasks[2].body = 4;
        let err = Batch::try_from(stored).unwrap_err();
        assert_eq!(err, "task t2 names body 4 of 4");
    }

    proptest! {
        #[test]
        fn any_bytes_are_an_error_or_a_value_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read::<After>(&bytes);
        }

        #[test]
        fn an_extension_round_trips(a in any::<u32>(), b in proptest::option::of(".{0,8}"), c in proptest::collection::vec(".{0,4}", 0..3), d in any::<u8>()) {
            let v = After { a, b, c, d };
            prop_assert_eq!(read::<After>(&stored(v.clone())).unwrap(), (v, 7));
        }
    }
}
