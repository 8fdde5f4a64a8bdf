//! FNV-1a 64: the one small, stable digest sortie journals (a batch's digest, a retry's jitter
//! seed). Not cryptographic. The algorithm must never change: its results are in journals.

/// FNV-1a 64 of `bytes` (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_64_test_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325, "the offset basis");
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a 64 test vector");
        assert_eq!(
            fnv1a(b"foobar"),
            0x8594_4171_f739_67e8,
            "FNV-1a 64 test vector"
        );
    }
}
