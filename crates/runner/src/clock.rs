//! The runner's one wall clock (core never reads a clock: the runner passes the time in), its
//! bridge to tokio's monotonic clock, and run ids, which are named after it.
//!
//! Deadlines are journaled as wall-clock [`Timestamp`]s; timers run on tokio's [`Instant`]s
//! (which a test can pause and advance). An [`Anchor`] pairs one reading of each, so that a
//! wall-clock time becomes an instant by one subtraction, and code that keeps both clocks
//! apart (the attempt's watchdog) can be tested on a paused clock with a synthetic anchor.

use std::time::{SystemTime, UNIX_EPOCH};

use sortie_core::{RunId, Timestamp};
use tokio::time::Instant;

/// The current wall-clock time.
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A fresh run id: `YYYYMMDD-HHMMSS-xxxx` (UTC) with a suffix from the pid and the clock.
pub fn new_run_id() -> RunId {
    let at = SystemTime::now();
    let nanos = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    // `2026-12-01T19:20:07Z` → `20261201-192007`.
    let stamp: String = humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter_map(|c| match c {
            'T' => Some('-'),
            '0'..='9' => Some(c),
            _ => None,
        })
        .collect();
    let mix = (u64::from(nanos) ^ (u64::from(std::process::id()) << 17))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let id = format!("{stamp}-{:04x}", mix >> 48);
    // Digits, a dash and hex digits: always a valid run id.
    RunId::new(id).expect("a run id of digits, dashes and hex digits is valid")
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

    /// Like [`Anchor::instant_of`], but a time already past is an instant as far before the
    /// reading (as far as the monotonic clock reaches back): re-arms clocks that started
    /// before this process did.
    pub fn instant_of_past(&self, t: Timestamp) -> Instant {
        let back = std::time::Duration::from_millis(self.wall.0.saturating_sub(t.0));
        self.instant.checked_sub(back).unwrap_or(self.instant) + t.since(self.wall)
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

    #[test]
    fn run_ids_look_like_dates() {
        let id = new_run_id();
        let s = id.as_str();
        assert_eq!(s.len(), 20, "{id}");
        assert_eq!(&s[8..9], "-", "{id}");
        assert_eq!(&s[15..16], "-", "{id}");
        assert!(s[..8].chars().all(|c| c.is_ascii_digit()), "{id}");
        assert!(s.starts_with("20"), "{id}");
    }
}
