//! The streaming encoder a compressed response is written through: one per response, fed
//! each piece of the upstream's body as it arrives and flushed after it (a sync flush), so
//! nothing is held back — an event stream's event reaches the client when the upstream sends
//! it, whatever the coding. The cost is a few bytes per flush, which a body read in 16 KiB
//! pieces does not notice.
//!
//! Synchronous encoders over a `Vec` (`flate2`, `brotli`, `zstd`): the fronts already own the
//! reading and writing, so an async adapter (`async-compression`) would only add a layer.
//!
//! **Memory is bounded per response** by the window and tables chosen here, whatever the
//! level: a response whose client stops reading holds its encoder for as long as it lasts, so
//! what one holds is what a slow client can make the gateway keep. Measured after 256 KiB of
//! JSON pushed in 16 KiB pieces, each flushed (live heap under a counting allocator;
//! `ZSTD_sizeof_CCtx` for zstd's context), levels 1–9:
//!
//! - brotli: quality 1 (its one-pass compressor) and a 64 KiB window, whatever the level:
//!   ~110 KiB. (Quality 2–4 take 0.6–1 MB, 5 and above 34 MB: the level is not brotli's.)
//! - zstd: the level's, with a 32 KiB window and hash/chain tables of 2^14/2^13 entries:
//!   300–340 KiB (at its own defaults 1.1 MB at level 1, 11 MB at 9), plus the writer's
//!   32 KiB buffer.
//! - gzip: zlib's 32 KiB window at memory level 8: ~410 KiB (zlib-rs).
//!
//! And a worker runs at most [`MAX_ENCODERS_PER_WORKER`] at once ([`Slots`]): past them a
//! response goes as identity. The manual's Compression page says the same.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::Coding;

/// brotli's window (log2 bytes): 64 KiB. Its one-pass quality keeps no more.
const BR_WINDOW_LOG: u32 = 16;

/// The brotli quality used, whatever the level: 1, the one-pass compressor (about 110 KiB an
/// encoder). Quality 2 and above keep hash tables of 0.6 MB (quality 2–4) to 34 MB (5 and
/// above) an encoder, which a slow client holds for as long as it reads slowly.
const BR_QUALITY: u32 = 1;

/// zstd's window (log2 bytes): 32 KiB, gzip's.
const ZSTD_WINDOW_LOG: u32 = 15;

/// zstd's hash and chain tables (log2 entries of 4 bytes): at the levels' own sizes (2^16 to
/// 2^22) they are most of a context's memory.
const ZSTD_HASH_LOG: u32 = 14;
const ZSTD_CHAIN_LOG: u32 = 13;

/// The most response encoders one worker runs at once: past them a response that could be
/// compressed goes as identity (still varying), so that stalled compressed responses hold at
/// most this many encoders' memory on a worker.
pub const MAX_ENCODERS_PER_WORKER: usize = 128;

/// The level each coding uses when the config sets none: the usual on-the-fly choices.
fn default_level(c: Coding) -> u32 {
    match c {
        Coding::Gzip => 6,
        Coding::Br => 4,
        Coding::Zstd => 3,
    }
}

/// A worker's encoder places ([`MAX_ENCODERS_PER_WORKER`]): one taken by each compressed
/// response while it streams, given back when its encoder is dropped (the body ended, or the
/// client left).
#[derive(Debug, Default)]
pub struct Slots(Arc<AtomicUsize>);

impl Slots {
    /// A place for one more encoder; `None` when every place is taken.
    pub fn take(&self) -> Option<Slot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_ENCODERS_PER_WORKER).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(&self.0)))
    }

    /// How many places are taken now.
    pub fn taken(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One taken place of [`Slots`], given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
    /// The worker's place it holds (a streamed response's), given back with it.
    _slot: Option<Slot>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("coding", &self.coding)
            .finish()
    }
}

impl Encoder {
    /// An encoder for `coding` at `level` (1–9; `None`: the coding's default), within the
    /// memory bound (see the module comment).
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
                BR_QUALITY,
                BR_WINDOW_LOG,
            ))),
            Coding::Zstd => {
                use zstd::stream::raw::CParameter;
                let level = i32::try_from(level).unwrap_or(3);
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                e.window_log(ZSTD_WINDOW_LOG)?;
                e.set_parameter(CParameter::HashLog(ZSTD_HASH_LOG))?;
                e.set_parameter(CParameter::ChainLog(ZSTD_CHAIN_LOG))?;
                Inner::Zstd(e)
            }
        };
        Ok(Encoder {
            inner,
            coding,
            _slot: None,
        })
    }

    /// An encoder for a streamed response, holding one of the worker's places (`slots`);
    /// `None` when all are taken (the response goes as identity) or the encoder cannot be made.
    pub fn streaming(coding: Coding, level: Option<u32>, slots: &Slots) -> Option<Encoder> {
        let slot = slots.take()?;
        let mut e = Encoder::new(coding, level).ok()?;
        e._slot = Some(slot);
        Some(e)
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
    fn a_worker_runs_at_most_its_encoders() {
        let slots = Slots::default();
        let held: Vec<Encoder> = (0..MAX_ENCODERS_PER_WORKER)
            .map(|_| Encoder::streaming(Coding::Gzip, None, &slots).unwrap())
            .collect();
        assert_eq!(slots.taken(), MAX_ENCODERS_PER_WORKER);
        assert!(Encoder::streaming(Coding::Br, None, &slots).is_none());
        drop(held);
        assert_eq!(slots.taken(), 0);
        assert!(Encoder::streaming(Coding::Zstd, Some(9), &slots).is_some());
        assert_eq!(slots.taken(), 0, "given back with its encoder");
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
