//! Body codecs: the chunked decoder (on the framing rules of [`super::framing`]), the chunk
//! encoder, and the response body's framing as RFC 9112 §6.3 reads it.
//!
//! Decoding works on whatever bytes were read, in place: it returns how much it consumed and
//! the data slice found, so a body streams through one bounded buffer per side and is never
//! collected.

use super::framing::{step, Chunk};

/// The most bytes of chunk extensions and trailers one body may carry (hyper's limits are of
/// this size): past it the body is refused, so a client cannot keep a request open forever
/// with framing alone.
pub const MAX_FRAMING_BYTES: usize = 16 * 1024;

/// Why a chunked body could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("malformed chunked framing")]
    Malformed,
    #[error("too many bytes of chunk extensions or trailers")]
    TooLong,
}

/// A chunked body's decoder.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    /// `None` once the body ended.
    state: Option<Chunk>,
    framing_bytes: usize,
    /// The trailer section's bytes (its field lines, each with its CRLF), kept when asked
    /// ([`ChunkedDecoder::keeping_trailers`]); bounded as the framing is, by
    /// [`MAX_FRAMING_BYTES`].
    trailers: Option<Vec<u8>>,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            state: Some(Chunk::Start),
            framing_bytes: 0,
            trailers: None,
        }
    }
}

/// What one call of [`ChunkedDecoder::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of the input consumed.
    pub consumed: usize,
    /// Chunk data: `input[data.0..data.1]` (empty when none).
    pub data: (usize, usize),
}

impl ChunkedDecoder {
    /// Whether the body ended (the last chunk and the trailers were read).
    pub fn is_done(&self) -> bool {
        self.state.is_none()
    }

    /// A decoder that keeps the trailer section (for a cost read from a trailer,
    /// `cost_from = "trailer:…"`); see [`ChunkedDecoder::trailers`].
    pub fn keeping_trailers() -> ChunkedDecoder {
        ChunkedDecoder {
            trailers: Some(Vec::new()),
            ..ChunkedDecoder::default()
        }
    }

    /// The trailer fields kept (a decoder made by [`ChunkedDecoder::keeping_trailers`]), once
    /// the body ended: each field line as `(name, value)`, the value without the spaces
    /// around it. A line without a colon is skipped.
    pub fn trailers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.trailers
            .as_deref()
            .filter(|_| self.is_done())
            .unwrap_or_default()
            .split(|b| *b == b'\n')
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|b| *b == b':')?;
                let (name, value) = line.split_at(colon);
                Some((
                    name,
                    super::framing::trim(value.get(1..).unwrap_or_default()),
                ))
            })
    }

    /// Decodes from `input` up to the first chunk data (returned) or the end of the body or
    /// of the input. Trailers are read and dropped (a proxy forwards them only when the
    /// response announced them, which hop-by-hop rules remove), or kept for the charge of a
    /// decoder made by [`ChunkedDecoder::keeping_trailers`].
    pub fn decode(&mut self, input: &[u8]) -> Result<Decoded, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let Some(state) = self.state else { break };
            if let Chunk::Data(left) = state {
                let n = (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                let left = left - n as u64;
                self.state = Some(if left == 0 {
                    Chunk::DataCr
                } else {
                    Chunk::Data(left)
                });
                return Ok(Decoded {
                    consumed: i + n,
                    data: (i, i + n),
                });
            }
            if matches!(state, Chunk::Ext(_) | Chunk::Trailer | Chunk::TrailerLf) {
                self.framing_bytes += 1;
                if self.framing_bytes > MAX_FRAMING_BYTES {
                    return Err(ChunkError::TooLong);
                }
            }
            if let Some(kept) = self.trailers.as_mut() {
                // A trailer line's bytes: from its first (after the last chunk's CRLF or the
                // line before's) to its LF.
                let b = input[i];
                if matches!(state, Chunk::Trailer | Chunk::TrailerLf)
                    || (state == Chunk::EndCr && b != b'\r')
                {
                    kept.push(b);
                }
            }
            self.state = match step(state, input[i]) {
                Some(next) => next,
                None => return Err(ChunkError::Malformed),
            };
            i += 1;
        }
        Ok(Decoded {
            consumed: i,
            data: (i, i),
        })
    }
}

impl ChunkedDecoder {
    /// The length of a whole chunked body at the start of `buf`, if it is all there (and
    /// well-formed).
    pub fn decode_all_buffered(&mut self, buf: &[u8]) -> Option<usize> {
        let mut at = 0;
        while !self.is_done() {
            let r = self.decode(buf.get(at..)?).ok()?;
            if r.consumed == 0 {
                return None;
            }
            at += r.consumed;
        }
        Some(at)
    }
}

/// The head of one chunk of `len` bytes (`{len:x}\r\n`), written into `out`.
pub fn chunk_head(len: usize, out: &mut [u8; 20]) -> &[u8] {
    let mut n = len;
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    let hex = &digits[i..];
    out[..hex.len()].copy_from_slice(hex);
    out[hex.len()] = b'\r';
    out[hex.len() + 1] = b'\n';
    &out[..hex.len() + 2]
}

/// How a response's body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body (a `HEAD` request, `1xx`, `204`, `304`).
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

impl ResponseBody {
    /// The framing of a response of `status` to a request of `head_request`, with these
    /// `Transfer-Encoding` and `Content-Length` findings; `None` when it cannot be read (a
    /// malformed or conflicting `Content-Length`).
    pub fn of(
        head_request: bool,
        status: u16,
        te_chunked: Option<bool>,
        length: Option<Option<u64>>,
    ) -> Option<ResponseBody> {
        if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
            return Some(ResponseBody::None);
        }
        match (te_chunked, length) {
            (Some(true), _) => Some(ResponseBody::Chunked),
            (Some(false), _) => Some(ResponseBody::Close),
            (None, Some(Some(n))) => Some(ResponseBody::Length(n)),
            (None, Some(None)) => None,
            (None, None) => Some(ResponseBody::Close),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], step_by: usize) -> Result<(Vec<u8>, bool), ChunkError> {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut fed = 0;
        let mut buf: Vec<u8> = Vec::new();
        while fed < input.len() || !buf.is_empty() {
            let take = step_by.min(input.len() - fed);
            buf.extend_from_slice(&input[fed..fed + take]);
            fed += take;
            loop {
                let r = d.decode(&buf)?;
                out.extend_from_slice(&buf[r.data.0..r.data.1]);
                buf.drain(..r.consumed);
                if r.consumed == 0 || d.is_done() {
                    break;
                }
            }
            if d.is_done() || (take == 0 && fed == input.len()) {
                break;
            }
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn decodes_in_any_split() {
        let body = b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(
                decode_all(body, step).unwrap(),
                (b"hello world".to_vec(), true),
                "{step}"
            );
        }
        assert_eq!(decode_all(b"zz\r\n", 1), Err(ChunkError::Malformed));
        assert_eq!(
            decode_all(b"fffffffffffffffff\r\n", 4),
            Err(ChunkError::Malformed)
        );
        assert_eq!(decode_all(b"3\r\nabcX", 8), Err(ChunkError::Malformed));
    }

    #[test]
    fn trailers_are_kept_when_asked() {
        let body = b"5\r\nhello\r\n0\r\nX-Cost: 7\r\nx-other:a b \r\nbad\r\n\r\n";
        for step in [1, 2, 5, 100] {
            let mut d = ChunkedDecoder::keeping_trailers();
            let mut fed = 0;
            let mut buf = Vec::new();
            while !d.is_done() {
                let take = step.min(body.len() - fed);
                buf.extend_from_slice(&body[fed..fed + take]);
                fed += take;
                loop {
                    let r = d.decode(&buf).unwrap();
                    buf.drain(..r.consumed);
                    if r.consumed == 0 || d.is_done() {
                        break;
                    }
                }
            }
            let t: Vec<_> = d.trailers().collect();
            assert_eq!(
                t,
                [(&b"X-Cost"[..], &b"7"[..]), (b"x-other", b"a b")],
                "{step}"
            );
        }
        // Not kept unless asked, and none before the end.
        let mut d = ChunkedDecoder::default();
        assert_eq!(d.decode(b"0\r\nX-Cost: 7\r\n\r\n").unwrap().consumed, 16);
        assert_eq!(d.trailers().count(), 0);
        let mut d = ChunkedDecoder::keeping_trailers();
        d.decode(b"0\r\nX-Cost: 7\r\n").unwrap();
        assert_eq!(d.trailers().count(), 0);
    }

    #[test]
    fn chunk_heads_are_hex() {
        let mut b = [0u8; 20];
        assert_eq!(chunk_head(0, &mut b), b"0\r\n");
        assert_eq!(chunk_head(255, &mut b), b"ff\r\n");
        assert_eq!(chunk_head(usize::MAX, &mut b).len(), 18);
    }

    #[test]
    fn response_framing() {
        assert_eq!(
            ResponseBody::of(true, 200, Some(true), None),
            Some(ResponseBody::None)
        );
        assert_eq!(
            ResponseBody::of(false, 304, None, Some(Some(5))),
            Some(ResponseBody::None)
        );
        assert_eq!(
            ResponseBody::of(false, 200, None, Some(Some(5))),
            Some(ResponseBody::Length(5))
        );
        assert_eq!(
            ResponseBody::of(false, 200, Some(false), None),
            Some(ResponseBody::Close)
        );
        assert_eq!(ResponseBody::of(false, 200, None, Some(None)), None);
    }
}
