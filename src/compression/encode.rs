//! The streaming encoder a compressed response is written through: one per response, fed
//! each piece of the upstream's body as it arrives and flushed after it (a sync flush), so
//! nothing is held back — an event stream's event reaches the client when the upstream sends
//! it, whatever the coding. The cost is a few bytes per flush, which a body read in 16 KiB
//! pieces does not notice.
//!
//! Synchronous encoders over a `Vec` (`flate2`, `brotli`, `zstd`): the fronts already own the
//! reading and writing, so an async adapter (`async-compression`) would only add a layer.
//! Memory is bounded per response by the window sizes chosen here: gzip 32 KiB, brotli
//! 2^18 bytes, zstd 2^18 bytes.

use std::io::Write;

use crate::config::Coding;

/// The window (log2 bytes) of brotli and zstd: 256 KiB, enough for the JSON and text a gateway
/// compresses, small enough for many streams at once.
const WINDOW_LOG: u32 = 18;

/// The level each coding uses when the config sets none: the usual on-the-fly choices.
fn default_level(c: Coding) -> u32 {
    match c {
        Coding::Gzip => 6,
        Coding::Br => 4,
        Coding::Zstd => 3,
    }
}

enum Inner {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// A response body's encoder.
pub struct Encoder {
    inner: Inner,
    coding: Coding,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("coding", &self.coding)
            .finish()
    }
}

impl Encoder {
    /// An encoder for `coding` at `level` (1–9; `None`: the coding's default).
    pub fn new(coding: Coding, level: Option<u32>) -> std::io::Result<Encoder> {
        let level = level.unwrap_or(default_level(coding));
        let inner = match coding {
            Coding::Gzip => Inner::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(level),
            )),
            Coding::Br => Inner::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                level,
                WINDOW_LOG,
            ))),
            Coding::Zstd => {
                let level = i32::try_from(level).unwrap_or(3);
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                e.window_log(WINDOW_LOG)?;
                Inner::Zstd(e)
            }
        };
        Ok(Encoder { inner, coding })
    }

    /// The coding, for `Content-Encoding`.
    pub fn coding(&self) -> Coding {
        self.coding
    }

    /// Encodes `data` and flushes: what to send now is appended to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        let sink = match &mut self.inner {
            Inner::Gzip(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Inner::Br(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Inner::Zstd(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
        };
        out.append(sink);
        Ok(())
    }

    /// Ends the stream: its last bytes are appended to `out`.
    pub fn finish(self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let mut tail = match self.inner {
            Inner::Gzip(e) => e.finish()?,
            Inner::Br(e) => e.into_inner(),
            Inner::Zstd(e) => e.finish()?,
        };
        out.append(&mut tail);
        Ok(())
    }

    /// Compresses a whole body at once (the gateway's own answers).
    pub fn whole(coding: Coding, level: Option<u32>, body: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut e = Encoder::new(coding, level)?;
        e.push(body, &mut out)?;
        e.finish(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn decode(c: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match c {
            Coding::Gzip => {
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Coding::Br => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Coding::Zstd => out = zstd::stream::decode_all(data).unwrap(),
        }
        out
    }

    #[test]
    fn each_piece_is_decodable_when_flushed_and_the_whole_round_trips() {
        for c in [Coding::Gzip, Coding::Br, Coding::Zstd] {
            let mut e = Encoder::new(c, None).unwrap();
            let mut out = Vec::new();
            e.push(b"data: one\n\n", &mut out).unwrap();
            assert!(!out.is_empty(), "{c:?}: a flushed piece is sent at once");
            e.push(b"data: two\n\n", &mut out).unwrap();
            e.finish(&mut out).unwrap();
            assert_eq!(decode(c, &out), b"data: one\n\ndata: two\n\n", "{c:?}");
            let body = br#"{"items":[1,2,3,4,5,6,7,8,9,10,1,2,3,4,5,6,7,8,9,10]}"#.repeat(50);
            let whole = Encoder::whole(c, Some(9), &body).unwrap();
            assert!(whole.len() < body.len() / 10, "{c:?}: {}", whole.len());
            assert_eq!(decode(c, &whole), body);
        }
    }
}
