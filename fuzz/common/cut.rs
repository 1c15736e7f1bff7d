//! Shared by the fuzz targets that feed a parser in pieces (`h1_scan`, `resp_decode`).

/// `stream` cut into reads of 1 to `max` bytes, sizes from a small xorshift generator seeded by
/// `seed` (the same input always cuts the same way).
pub fn cut(stream: &[u8], seed: u8, max: u32) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut reads = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = usize::try_from(state % max.max(1) + 1)
            .unwrap_or(1)
            .min(rest.len());
        let (read, tail) = rest.split_at(n);
        reads.push(read);
        rest = tail;
    }
    reads
}
