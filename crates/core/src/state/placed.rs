//! Where an attempt runs (`AttemptPlaced`), with the executor and directory parent shared by
//! a run's placements, and what a resume found of it.

use std::collections::BTreeMap;
use std::sync::Arc;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// Where an attempt runs and how it is found again (`AttemptPlaced`, `AttemptHandle`), and
/// what resumes found of it (`AttemptAdopted`, `AttemptRecorded`). The executor's name and the
/// attempt dir's parent are shared by the run's attempts (see [`Placed::executor`] and
/// [`Placed::dir`]): a big run holds no copy of them per attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// The executor's name and the attempt dir's parent, shared.
    pub(super) at: Arc<PlacedAt>,
    /// The attempt dir's name: the dir is its parent and its name joined.
    name: CompactString,
    /// The executor's own id, once known.
    pub handle: Option<String>,
    /// What the last resume that found it alive or ended saw, and which resume that was (the
    /// run's `resumes` count then).
    pub found: Option<(u32, Found)>,
    /// The offset in its stdout up to which the journal holds what it said (`AttemptRead`).
    #[serde(default)]
    pub read: u64,
}

impl Placed {
    /// A placement on `executor` in `dir`, not yet found by a resume.
    pub fn new(executor: &str, dir: &str) -> Self {
        Placed::interned(executor, dir, &mut Interner::default())
    }

    /// [`Placed::new`], its executor and dir parent shared through `strings`.
    pub(crate) fn interned(executor: &str, dir: &str, strings: &mut Interner) -> Self {
        let cut = dir.rfind('/').map_or(0, |i| i + 1);
        Placed {
            at: strings.get(executor, &dir[..cut]),
            name: CompactString::new(&dir[cut..]),
            handle: None,
            found: None,
            read: 0,
        }
    }

    /// The executor's name.
    pub fn executor(&self) -> &str {
        &self.at.executor
    }

    /// The attempt dir, as `AttemptPlaced` named it.
    pub fn dir(&self) -> String {
        let parent = &self.at.parent;
        let mut dir = String::with_capacity(parent.len() + self.name.len());
        dir.push_str(parent);
        dir.push_str(&self.name);
        dir
    }
}

/// Where placements are: an executor's name and an attempt dir's parent (ending with its `/`,
/// or empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PlacedAt {
    executor: Box<str>,
    parent: Box<str>,
}

/// The executors and dir parents placements share, by executor then parent: each distinct
/// pair is held once. A cache, not state: two states are equal whatever their interners hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner(BTreeMap<Box<str>, BTreeMap<Box<str>, Arc<PlacedAt>>>);

impl Interner {
    /// The shared copy of (`executor`, `parent`).
    fn get(&mut self, executor: &str, parent: &str) -> Arc<PlacedAt> {
        if let Some(shared) = self.0.get(executor).and_then(|p| p.get(parent)) {
            return Arc::clone(shared);
        }
        let shared = Arc::new(PlacedAt {
            executor: executor.into(),
            parent: parent.into(),
        });
        self.0
            .entry(executor.into())
            .or_default()
            .insert(parent.into(), Arc::clone(&shared));
        shared
    }
}

impl PartialEq for Interner {
    fn eq(&self, _: &Interner) -> bool {
        true
    }
}

impl Eq for Interner {}

/// What a resume found of a placed attempt that was live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// Still running: adopted.
    Adopted,
    /// Ended while no sortie watched: recorded from its files.
    Recorded,
}
