//! The gateway's own response fields (the rate-limit headers, the request id), written through
//! [`FieldSink`]: into a `HeaderMap` (the hyper front, the gateway's answers) or into
//! [`Fields`], the short list the fast HTTP/1 front writes straight into the response head —
//! no hash table and no `HeaderValue` allocation per field on the hot path.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

/// Where the gateway's response fields go.
pub trait FieldSink {
    /// Sets `name` to `value`, replacing a value set before (in its place). A value a field
    /// may not carry (a control character other than tab) is not set, as `HeaderValue`
    /// refuses it.
    fn set(&mut self, name: &HeaderName, value: &[u8]);

    /// Sets `name` to the decimal `n`.
    fn set_number(&mut self, name: &HeaderName, n: u64) {
        self.set(name, itoa::Buffer::new().format(n).as_bytes());
    }
}

impl FieldSink for HeaderMap {
    fn set(&mut self, name: &HeaderName, value: &[u8]) {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            self.insert(name.clone(), v);
        }
    }

    fn set_number(&mut self, name: &HeaderName, n: u64) {
        self.insert(name.clone(), HeaderValue::from(n));
    }
}

/// Whether `value` is one a field may carry (what `HeaderValue::from_bytes` accepts): no
/// byte below 0x20 but tab, no DEL.
fn valid(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| (b >= 0x20 && b != 0x7f) || b == b'\t')
}

/// A few response fields in order, their values in one buffer.
///
/// Its values are the gateway's own and valid by construction — digits, limit names (letters,
/// digits, `-_.`), base64 partition keys, a request id that is already a `HeaderValue` — so
/// [`FieldSink::set`] checks them in debug builds only: the check cost 0.4k instructions a
/// response (`bench/instructions.sh`).
#[derive(Debug)]
pub struct Fields {
    names: SmallVec<[HeaderName; 8]>,
    spans: SmallVec<[(u32, u32); 8]>,
    bytes: Vec<u8>,
}

impl Default for Fields {
    /// Room for the usual rate-limit fields at once (one allocation).
    fn default() -> Self {
        Fields {
            names: SmallVec::new(),
            spans: SmallVec::new(),
            bytes: Vec::with_capacity(384),
        }
    }
}

impl Fields {
    fn push(&mut self, value: &[u8]) -> Option<(u32, u32)> {
        let start = u32::try_from(self.bytes.len()).ok()?;
        let end = u32::try_from(self.bytes.len().checked_add(value.len())?).ok()?;
        self.bytes.extend_from_slice(value);
        Some((start, end))
    }

    /// Adds a field after the others, whatever is set already (a name's further value: the
    /// response phase's `add` rules, `Vary`).
    pub fn add(&mut self, name: &HeaderName, value: &[u8]) {
        if let Some(span) = self.push(value) {
            self.names.push(name.clone());
            self.spans.push(span);
        }
    }

    /// Removes every field `name` set or added (its bytes stay in the buffer: a rare call).
    pub fn remove(&mut self, name: &HeaderName) {
        while let Some(i) = self.names.iter().position(|n| n == name) {
            self.names.remove(i);
            self.spans.remove(i);
        }
    }

    /// The fields in order: name, value.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &[u8])> + Clone + '_ {
        self.names.iter().zip(&self.spans).map(|(n, &(s, e))| {
            (
                n,
                self.bytes.get(s as usize..e as usize).unwrap_or_default(),
            )
        })
    }
}

impl FieldSink for Fields {
    fn set(&mut self, name: &HeaderName, value: &[u8]) {
        debug_assert!(valid(value), "{name}: {value:?}");
        match self.names.iter().position(|n| n == name) {
            // Names are set once each: the new value takes the old one's place.
            Some(i) => {
                if let Some(span) = self.push(value) {
                    self.spans[i] = span;
                }
            }
            None => {
                if let Some(span) = self.push(value) {
                    self.names.push(name.clone());
                    self.spans.push(span);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_a_header_maps_order_and_replacement() {
        let a = HeaderName::from_static("a");
        let b = HeaderName::from_static("b");
        let mut f = Fields::default();
        let mut m = HeaderMap::new();
        for sink in [&mut f as &mut dyn FieldSink, &mut m] {
            sink.set(&a, b"1");
            sink.set_number(&b, 22);
            sink.set(&a, b"3");
        }
        m.set(&b, b"bad\r\nx: y");
        let got: Vec<(String, Vec<u8>)> =
            f.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
        let want: Vec<(String, Vec<u8>)> = m
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            got,
            vec![("a".into(), b"3".to_vec()), ("b".into(), b"22".to_vec())]
        );
    }

    #[test]
    fn valid_is_what_header_value_accepts() {
        let mut bytes: Vec<u8> = (0..=255u8).collect();
        bytes.extend(b"\"per-ip\";r=99;t=1;pk=:AbC+/=:, \"global\";r=1;t=1\t");
        // Every byte in every lane position, between plain ones.
        for b in 0..=255u8 {
            for pos in 0..17 {
                let mut v = vec![b'a'; 17];
                v[pos] = b;
                assert_eq!(
                    valid(&v),
                    HeaderValue::from_bytes(&v).is_ok(),
                    "{b:#x} at {pos}"
                );
            }
        }
        assert_eq!(valid(&bytes), HeaderValue::from_bytes(&bytes).is_ok());
        assert!(valid(&bytes[32..127]));
    }
}
