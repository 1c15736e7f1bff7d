//! A gzip response body decoded for its cost scan as it passes: a streaming decoder writing
//! into the scan of the decoded bytes, so nothing decoded is held (the decoder's window and
//! buffer, some 64 KiB, are all it adds). A decompression bomb is stopped at
//! [`MAX_DECODED`] decoded bytes: the scan is then *malformed*, like a body that is not gzip
//! or ends inside its gzip stream.

use std::io::Write;

use super::Mode;

/// The most decoded bytes scanned (64 MiB): past it the body is malformed for its cost.
pub const MAX_DECODED: u64 = 64 * 1024 * 1024;

/// What the decoder writes into: the scan of the decoded body, counting what it is given.
pub(crate) struct Feed {
    inner: Mode,
    decoded: u64,
}

impl Write for Feed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        self.decoded = self.decoded.saturating_add(n);
        if self.decoded > MAX_DECODED {
            return Err(std::io::Error::other("decoded body over the scan's bound"));
        }
        self.inner.feed(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The scan of a gzip body: `None` once it failed (not gzip, or over the bound).
pub(crate) struct GzipScan {
    decoder: Option<flate2::write::GzDecoder<Feed>>,
}

impl GzipScan {
    pub(crate) fn new(inner: Mode) -> GzipScan {
        GzipScan {
            decoder: Some(flate2::write::GzDecoder::new(Feed { inner, decoded: 0 })),
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if let Some(d) = self.decoder.as_mut() {
            if d.write_all(bytes).is_err() {
                self.decoder = None;
            }
        }
    }

    /// The scan of the decoded body, when the gzip stream was whole and within the bound.
    pub(crate) fn finish(&mut self) -> Option<&mut Mode> {
        let d = self.decoder.as_mut()?;
        if d.try_finish().is_err() {
            self.decoder = None;
            return None;
        }
        self.decoder.as_mut().map(|d| &mut d.get_mut().inner)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BodyScan, Found};
    use super::*;
    use crate::config::{CostSource, CostSourceKind};
    use http::header::{HeaderMap, HeaderValue, CONTENT_ENCODING};

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn scan_of(body: &[u8], piece: usize) -> Found {
        let source = CostSource {
            source: CostSourceKind::Json(vec!["usage".into(), "total_tokens".into()].into()),
            weight: 1,
        };
        let mut h = HeaderMap::new();
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let mut s = BodyScan::new(std::iter::once(&source), &h);
        for p in body.chunks(piece) {
            s.data(p);
        }
        s.end();
        s.found(&source.source)
    }

    #[test]
    fn a_gzip_body_is_scanned_decoded_and_a_bomb_is_malformed() {
        let body = gz(br#"{"usage":{"total_tokens":42}}"#);
        assert_eq!(scan_of(&body, 1), Found::Value(42));
        assert_eq!(scan_of(&body, 7), Found::Value(42));
        // Cut short, or not gzip at all: malformed.
        assert_eq!(scan_of(&body[..body.len() - 4], 7), Found::Malformed);
        assert_eq!(
            scan_of(br#"{"usage":{"total_tokens":42}}"#, 7),
            Found::Malformed
        );
        // A bomb: 80 MiB of spaces before the value, sent as some 80 KiB.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(9));
        bomb.write_all(b"{\"usage\":").unwrap();
        let spaces = vec![b' '; 1 << 20];
        for _ in 0..80 {
            bomb.write_all(&spaces).unwrap();
        }
        bomb.write_all(br#"{"total_tokens":42}}"#).unwrap();
        let bomb = bomb.finish().unwrap();
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        assert_eq!(scan_of(&bomb, 16 * 1024), Found::Malformed);
    }
}
