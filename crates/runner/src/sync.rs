//! Locking a mutex the way the runner's threads and tasks all do: a poisoned lock's data is
//! taken as it is (every holder leaves it whole).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, taking the data of a poisoned one (its holders never leave it half done).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
