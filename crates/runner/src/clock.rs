//! The runner's one wall clock, and its bridge to tokio's monotonic clock.
//!
//! Deadlines are journaled as wall-clock [`Timestamp`]s; timers run on tokio's [`Instant`]s
//! (which a test can pause and advance). An [`Anchor`] pairs one reading of each, so that a
//! wall-clock time becomes an instant by one subtraction, and code that keeps both clocks
//! apart (the attempt's watchdog) can be tested on a paused clock with a synthetic anchor.

use std::time::{SystemTime, UNIX_EPOCH};

use sortie_core::Timestamp;
use tokio::time::Instant;

/// The current wall-clock time.
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// One reading of both clocks, taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The wall-clock time of the reading.
    pub wall: Timestamp,
    /// The tokio instant of the same reading.
    pub instant: Instant,
}

impl Anchor {
    /// Reads both clocks now.
    pub fn now() -> Anchor {
        Anchor {
            wall: now(),
            instant: Instant::now(),
        }
    }

    /// The instant at which the wall clock shows `t`, as far as this reading tells (a time
    /// already past is the reading's instant).
    pub fn instant_of(&self, t: Timestamp) -> Instant {
        self.instant + t.since(self.wall)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_time_becomes_an_instant_on_a_paused_clock() {
        let anchor = Anchor {
            wall: Timestamp(10_000),
            instant: Instant::now(),
        };
        assert_eq!(
            anchor.instant_of(Timestamp(12_500)),
            anchor.instant + Duration::from_millis(2_500)
        );
        assert_eq!(
            anchor.instant_of(Timestamp(9_000)),
            anchor.instant,
            "past is now"
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            anchor.instant_of(Timestamp(12_500)),
            anchor.instant + Duration::from_millis(2_500),
            "the anchor, not the clock, decides"
        );
    }
}
