//! The compact serde form of a run's state (what a journal snapshot stores): task specs that
//! differ only in their label are stored once, and the big vectors are decoded into exactly
//! the room they need.
//!
//! A batch of 100,000 generated tasks usually holds a handful of distinct specs: stored whole,
//! its specs were most of a snapshot's bytes and of the time to decode one (each spec is ~30
//! fields and a few strings, decoded one by one). Here a batch is stored as its distinct specs
//! (label left empty) and, per task, its label and the index of its spec; decoding clones the
//! spec and sets the label. serde's own `Vec` decoding grows a vector from a cautious guess
//! (at most 1 MiB ahead) by doubling, so a 100,000-element vector of 368-byte records peaked at
//! twice its size: [`exact`] reserves the length the encoding states (bounded).
//!
//! RunState's serde form is only ever the snapshot's (the snapshot's schema fingerprint covers
//! this file).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::spec::{AgentProfile, Batch, RunConfig, TaskSpec};

/// The most elements a vector reserves ahead from its stated length (more still decode, growing
/// as serde's own would): a length in a damaged encoding never reserves gigabytes.
const MAX_RESERVE: usize = 1 << 20;

/// How many distinct specs the encoder compares each task with (the most recent ones): batches
/// repeat a spec in runs, and a batch of all-different specs must not cost a quadratic pass.
const RECENT: usize = 8;

/// A vector, decoded into exactly the room its stated length needs.
pub(super) fn exact<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    d.deserialize_seq(ExactVec(PhantomData))
}

struct ExactVec<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ExactVec<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_RESERVE));
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(out)
    }
}

#[derive(Serialize)]
struct BatchOut<'a> {
    specs: Vec<TaskSpec>,
    tasks: Vec<(&'a str, u32)>,
    agents: &'a BTreeMap<String, AgentProfile>,
    config: &'a RunConfig,
    source: &'a str,
}

#[derive(Deserialize)]
struct BatchIn {
    specs: Vec<TaskSpec>,
    #[serde(deserialize_with = "exact")]
    tasks: Vec<(String, u32)>,
    agents: BTreeMap<String, AgentProfile>,
    config: RunConfig,
    source: String,
}

/// `RunState::batch` in its compact form.
pub(super) mod batch {
    use super::*;

    pub(in crate::state) fn serialize<S: Serializer>(
        batch: &Option<Batch>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        batch.as_ref().map(compact).serialize(s)
    }

    pub(in crate::state) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Batch>, D::Error> {
        match Option::<BatchIn>::deserialize(d)? {
            None => Ok(None),
            Some(b) => expand(b).map(Some).map_err(D::Error::custom),
        }
    }
}

/// The batch with each distinct spec once. A task is compared with the recent distinct specs
/// by giving each the task's label for the comparison (a label's copy, not a spec's clone: the
/// clone per task was half of a snapshot's encoding, callgrind on the 100,000-task run).
fn compact(batch: &Batch) -> BatchOut<'_> {
    let mut specs: Vec<TaskSpec> = Vec::new();
    let mut tasks = Vec::with_capacity(batch.tasks.len());
    for spec in &batch.tasks {
        let recent = specs.len().saturating_sub(RECENT);
        let found = specs[recent..].iter_mut().rposition(|s| {
            s.label.clear();
            s.label.push_str(&spec.label);
            s == spec
        });
        let index = match found {
            Some(i) => recent + i,
            None => {
                specs.push(spec.clone());
                specs.len() - 1
            }
        };
        tasks.push((spec.label.as_str(), index as u32));
    }
    for s in &mut specs {
        s.label = String::new();
    }
    BatchOut {
        specs,
        tasks,
        agents: &batch.agents,
        config: &batch.config,
        source: &batch.source,
    }
}

/// The batch back, each task its spec with its label.
fn expand(b: BatchIn) -> Result<Batch, String> {
    let tasks =
        b.tasks
            .into_iter()
            .map(|(label, index)| {
                let spec = b.specs.get(index as usize).ok_or_else(|| {
                    format!("task {label} names spec {index} of {}", b.specs.len())
                })?;
                Ok(TaskSpec {
                    label,
                    ..spec.clone()
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
    Ok(Batch {
        tasks,
        agents: b.agents,
        config: b.config,
        source: b.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(prompts: &[&str]) -> Batch {
        Batch {
            tasks: prompts
                .iter()
                .enumerate()
                .map(|(i, p)| TaskSpec {
                    prompt: Some((*p).to_owned()),
                    ..TaskSpec::new(format!("t{i}"), "/w")
                })
                .collect(),
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "test.toml".into(),
        }
    }

    #[test]
    fn identical_specs_are_stored_once_and_come_back_with_their_labels() {
        let b = batch(&["a", "a", "a", "b", "a", "b", "c"]);
        let out = compact(&b);
        assert_eq!(out.specs.len(), 3, "a, b and c once each");
        let json = serde_json::to_string(&out).unwrap();
        let back: BatchIn = serde_json::from_str(&json).unwrap();
        assert_eq!(expand(back).unwrap(), b);
    }

    #[test]
    fn a_spec_index_past_the_table_is_an_error_not_a_panic() {
        let b = batch(&["a"]);
        let mut json: serde_json::Value = serde_json::to_value(compact(&b)).unwrap();
        json["tasks"][0][1] = 7.into();
        let back: BatchIn = serde_json::from_value(json).unwrap();
        assert!(expand(back).unwrap_err().contains("spec 7 of 1"));
    }
}
