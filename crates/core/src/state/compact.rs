//! The compact serde form of a run's state (what a journal snapshot stores): task bodies (a
//! task's fields but its label and prompt, see `TaskSpec`) are stored once each, and the big
//! vectors are decoded into exactly the room they need.
//!
//! A batch of 100,000 generated tasks usually holds a handful of distinct bodies: stored whole,
//! its specs were most of a snapshot's bytes and of the time to decode one (each body is ~30
//! fields and a few strings, decoded one by one). Here a batch is stored as its distinct bodies
//! and, per task, its label, its prompt and the index of its body; decoding shares each body's
//! `Arc` among its tasks, as the loader does. serde's own `Vec` decoding grows a vector from a
//! cautious guess (at most 1 MiB ahead) by doubling, so a 100,000-element vector of 368-byte
//! records peaked at twice its size: [`exact`] reserves the length the encoding states
//! (bounded).
//!
//! RunState's serde form is only ever the snapshot's (the snapshot's schema fingerprint covers
//! this file).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::spec::{AgentProfile, Batch, RunConfig, SpecBody, TaskSpec};

/// The most elements a vector reserves ahead from its stated length (more still decode, growing
/// as serde's own would): a length in a damaged encoding never reserves gigabytes.
const MAX_RESERVE: usize = 1 << 20;

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
    bodies: Vec<&'a SpecBody>,
    tasks: Vec<(&'a str, &'a Option<String>, u32)>,
    agents: &'a BTreeMap<String, AgentProfile>,
    config: &'a RunConfig,
    source: &'a str,
}

#[derive(Deserialize)]
struct BatchIn {
    bodies: Vec<SpecBody>,
    #[serde(deserialize_with = "exact")]
    tasks: Vec<(String, Option<String>, u32)>,
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

/// The batch with each distinct body once (`Batch::body_table`).
fn compact(batch: &Batch) -> BatchOut<'_> {
    let (bodies, index) = batch.body_table();
    let tasks = batch
        .tasks
        .iter()
        .zip(index)
        .map(|(spec, i)| (spec.label.as_str(), &spec.prompt, i))
        .collect();
    BatchOut {
        bodies: bodies.into_iter().map(|b| &**b).collect(),
        tasks,
        agents: &batch.agents,
        config: &batch.config,
        source: &batch.source,
    }
}

/// The batch back, each task its label and prompt with its shared body.
fn expand(b: BatchIn) -> Result<Batch, String> {
    let bodies: Vec<Arc<SpecBody>> = b.bodies.into_iter().map(Arc::new).collect();
    let tasks = b
        .tasks
        .into_iter()
        .map(|(label, prompt, index)| {
            let body = bodies
                .get(index as usize)
                .ok_or_else(|| format!("task {label} names body {index} of {}", bodies.len()))?;
            Ok(TaskSpec {
                label,
                prompt,
                body: Arc::clone(body),
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

    /// A batch of tasks in these directories, each with its own prompt.
    fn batch(cwds: &[&str]) -> Batch {
        Batch {
            tasks: cwds
                .iter()
                .enumerate()
                .map(|(i, cwd)| TaskSpec {
                    prompt: Some(format!("prompt {i}")),
                    ..TaskSpec::new(format!("t{i}"), *cwd)
                })
                .collect(),
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "test.toml".into(),
        }
    }

    #[test]
    fn equal_bodies_are_stored_once_and_come_back_shared_with_their_labels_and_prompts() {
        let mut b = batch(&["/a", "/a", "/a", "/b", "/a", "/b", "/c"]);
        b.share_bodies();
        let out = compact(&b);
        assert_eq!(out.bodies.len(), 3, "/a, /b and /c once each");
        let json = serde_json::to_string(&out).unwrap();
        let back = expand(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(back, b);
        assert!(Arc::ptr_eq(&back.tasks[0].body, &back.tasks[4].body));
        assert!(!Arc::ptr_eq(&back.tasks[0].body, &back.tasks[3].body));
    }

    #[test]
    fn bodies_equal_but_not_shared_are_stored_once_too() {
        let b = batch(&["/a", "/a", "/b"]);
        assert_eq!(compact(&b).bodies.len(), 2);
    }

    #[test]
    fn a_body_index_past_the_table_is_an_error_not_a_panic() {
        let b = batch(&["/a"]);
        let mut json: serde_json::Value = serde_json::to_value(compact(&b)).unwrap();
        json["tasks"][0][2] = 7.into();
        let back: BatchIn = serde_json::from_value(json).unwrap();
        assert!(expand(back).unwrap_err().contains("body 7 of 1"));
    }
}
