//! Fields that most records never set, boxed together (see [`Rare`]).

use serde::{Deserialize, Serialize};

/// Fields that most of a big run's records never set, boxed together: a record holds one
/// pointer, not the fields, until one of them is set. Equality is the fields': no box equals a
/// box of defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Rare<T>(Option<Box<T>>);

impl<T: Default> Rare<T> {
    /// The fields, if any was ever set.
    pub(crate) fn get(&self) -> Option<&T> {
        self.0.as_deref()
    }

    /// The fields, boxed now if they were not.
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(Box::default)
    }
}

impl<T: Default + PartialEq> PartialEq for Rare<T> {
    fn eq(&self, other: &Rare<T>) -> bool {
        match (self.get(), other.get()) {
            (Some(a), Some(b)) => a == b,
            (Some(x), None) | (None, Some(x)) => *x == T::default(),
            (None, None) => true,
        }
    }
}

impl<T: Default + Eq> Eq for Rare<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_box_equals_a_box_of_defaults_and_differs_from_a_set_one() {
        let none: Rare<(u32, Option<String>)> = Rare::default();
        let mut empty = Rare::default();
        empty.get_mut();
        assert_eq!(none, empty);
        assert_eq!(empty, none);
        let mut set: Rare<(u32, Option<String>)> = Rare::default();
        set.get_mut().1 = Some("x".to_owned());
        assert_ne!(none, set);
        assert_ne!(set, empty);
        assert_eq!(set.get().and_then(|s| s.1.as_deref()), Some("x"));
    }
}
