//! The wall clock, read in one place: core never reads a clock, the runner passes the time in.

use std::time::{SystemTime, UNIX_EPOCH};

use sortie_core::{RunId, Timestamp};

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

#[cfg(test)]
mod tests {
    use super::*;

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
