//! One stored response as a file of the disk tier ([`super::disk`]): its name is a hash of its
//! key, its content a small binary head (the key, status, times, lifetime, fields, `Vary`
//! values and tags), the body, and a CRC-32 of everything before it. Written whole to a
//! temporary name and renamed, so a file under an entry's name is never one being written;
//! the checksum catches what a crash after the rename (the page cache not yet on disk) or a
//! damaged disk left. Reading checks every length against the file's: a truncated, padded or
//! foreign file is an error ([`FileError`]), never a panic.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL};
use http::StatusCode;
use sha2::{Digest, Sha256};

use super::control::Directives;
use super::freshness::Times;
use super::store::Entry;

/// The first bytes of every file (the format's version is its last byte).
const MAGIC: &[u8; 8] = b"TGCACHE1";
/// The largest head read (the key, fields and tags): a file claiming more is not ours.
pub const MAX_HEAD: usize = 1 << 20;
/// Bytes before the head: the magic and the head's length.
const PREFIX: usize = MAGIC.len() + 4;

/// Why a file is no stored response.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("not a stored response (its first bytes)")]
    Magic,
    #[error("truncated or padded (lengths do not add up)")]
    Length,
    #[error("its checksum does not match (damaged)")]
    Checksum,
    #[error("a field or value is malformed")]
    Malformed,
}

/// The file name of `key`: 32 hex digits of its SHA-256.
pub fn name_of(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    crate::hex::encode(&digest[..16])
}

/// Whether `name` is an entry's file name (32 lower-case hex digits).
pub fn is_entry_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What the index keeps of a file: read from its head alone.
#[derive(Debug)]
pub struct Head {
    pub key: Box<str>,
    pub tags: Box<[Box<str>]>,
}

/// `entry` stored under `key`, as the bytes of its file.
pub fn encode(key: &str, entry: &Entry) -> Vec<u8> {
    let mut head = Vec::with_capacity(256 + key.len());
    head.extend_from_slice(&entry.status.as_u16().to_le_bytes());
    head.extend_from_slice(&entry.times.request.to_le_bytes());
    head.extend_from_slice(&entry.times.response.to_le_bytes());
    head.extend_from_slice(&entry.lifetime.to_le_bytes());
    put(&mut head, key.as_bytes());
    put_len(&mut head, entry.tags.len());
    for t in entry.tags.iter() {
        put(&mut head, t.as_bytes());
    }
    put_len(&mut head, entry.headers.len());
    for (n, v) in &entry.headers {
        put(&mut head, n.as_str().as_bytes());
        put(&mut head, v.as_bytes());
    }
    put_len(&mut head, entry.vary.len());
    for (n, v) in &entry.vary {
        put(&mut head, n.as_str().as_bytes());
        match v {
            None => head.push(0),
            Some(v) => {
                head.push(1);
                put(&mut head, v.as_bytes());
            }
        }
    }
    let mut out = Vec::with_capacity(PREFIX + head.len() + 8 + entry.body.len() + 4);
    out.extend_from_slice(MAGIC);
    put(&mut out, &head);
    out.extend_from_slice(&(entry.body.len() as u64).to_le_bytes());
    out.extend_from_slice(&entry.body);
    let mut crc = flate2::Crc::new();
    crc.update(&out);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A reader over a head's bytes: every read checked.
struct Cursor<'b> {
    rest: &'b [u8],
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], FileError> {
        if n > self.rest.len() {
            return Err(FileError::Length);
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, FileError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, FileError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, FileError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'b [u8], FileError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<&'b str, FileError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| FileError::Malformed)
    }
    /// A count of items of at least `min` bytes each, no more than the bytes left allow.
    fn count(&mut self, min: usize) -> Result<usize, FileError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.rest.len() {
            return Err(FileError::Length);
        }
        Ok(n)
    }
}

/// The head's length from a file's first bytes ([`PREFIX`] of them).
pub fn head_len(prefix: &[u8]) -> Result<usize, FileError> {
    if prefix.len() < PREFIX || &prefix[..MAGIC.len()] != MAGIC {
        return Err(FileError::Magic);
    }
    let mut c = Cursor {
        rest: &prefix[MAGIC.len()..],
    };
    let n = c.u32()? as usize;
    if n > MAX_HEAD {
        return Err(FileError::Length);
    }
    Ok(n)
}

/// The bytes [`head_len`] reads.
pub const PREFIX_LEN: usize = PREFIX;

/// What a head's bytes hold.
fn parse_head(head: &[u8]) -> Result<(Entry, Box<str>), FileError> {
    let mut c = Cursor { rest: head };
    let status = StatusCode::from_u16(c.u16()?).map_err(|_| FileError::Malformed)?;
    let request = c.u64()?;
    let response = c.u64()?;
    let lifetime = c.u64()?;
    let key: Box<str> = c.text()?.into();
    let n = c.count(4)?;
    let mut tags = Vec::with_capacity(n);
    for _ in 0..n {
        tags.push(Box::<str>::from(c.text()?));
    }
    let n = c.count(8)?;
    let mut headers = HeaderMap::with_capacity(n);
    for _ in 0..n {
        let name = HeaderName::from_bytes(c.bytes()?).map_err(|_| FileError::Malformed)?;
        let value = HeaderValue::from_bytes(c.bytes()?).map_err(|_| FileError::Malformed)?;
        headers.append(name, value);
    }
    let n = c.count(5)?;
    let mut vary = Vec::with_capacity(n);
    for _ in 0..n {
        let name = HeaderName::from_bytes(c.bytes()?).map_err(|_| FileError::Malformed)?;
        let value = match c.take(1)?[0] {
            0 => None,
            1 => Some(Box::<str>::from(c.text()?)),
            _ => return Err(FileError::Malformed),
        };
        vary.push((name, value));
    }
    if !c.rest.is_empty() {
        return Err(FileError::Length);
    }
    let directives = Directives::parse(headers.get_all(CACHE_CONTROL).iter().map(|v| v.as_bytes()));
    let entry = Entry {
        status,
        headers,
        body: Bytes::new(),
        times: Times { request, response },
        lifetime,
        directives,
        vary,
        tags: tags.into_boxed_slice(),
    };
    Ok((entry, key))
}

/// The index's view of a file from its first bytes (the prefix and the head, at least) and
/// its length: its key and tags, once its lengths are checked to add up to `file_len` (the
/// body's checksum is checked when it is read in full).
pub fn read_head(start: &[u8], file_len: u64) -> Result<Head, FileError> {
    let n = head_len(start)?;
    let end = PREFIX.checked_add(n).ok_or(FileError::Length)?;
    let head = start.get(PREFIX..end).ok_or(FileError::Length)?;
    let body_len = start
        .get(end..end + 8)
        .map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
        .ok_or(FileError::Length)?;
    let expected = (end as u64)
        .checked_add(8)
        .and_then(|x| x.checked_add(body_len))
        .and_then(|x| x.checked_add(4))
        .ok_or(FileError::Length)?;
    if expected != file_len {
        return Err(FileError::Length);
    }
    let (entry, key) = parse_head(head)?;
    Ok(Head {
        key,
        tags: entry.tags,
    })
}

/// A whole file's bytes as the stored response and its key.
pub fn decode(file: Vec<u8>) -> Result<(Entry, Box<str>), FileError> {
    let len = file.len();
    if len < PREFIX + 12 {
        return Err(FileError::Length);
    }
    let (content, sum) = file.split_at(len - 4);
    let mut crc = flate2::Crc::new();
    crc.update(content);
    let mut a = [0u8; 4];
    a.copy_from_slice(sum);
    if crc.sum() != u32::from_le_bytes(a) {
        return Err(FileError::Checksum);
    }
    let n = head_len(content)?;
    let end = PREFIX.checked_add(n).ok_or(FileError::Length)?;
    let head = content.get(PREFIX..end).ok_or(FileError::Length)?;
    let mut c = Cursor {
        rest: content.get(end..).ok_or(FileError::Length)?,
    };
    let body_len = usize::try_from(c.u64()?).map_err(|_| FileError::Length)?;
    if body_len != c.rest.len() {
        return Err(FileError::Length);
    }
    let (mut entry, key) = parse_head(head)?;
    let body_start = end + 8;
    entry.body = Bytes::from(file).slice(body_start..body_start + body_len);
    Ok((entry, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        let mut headers = HeaderMap::new();
        headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        Entry {
            status: StatusCode::NOT_FOUND,
            headers,
            body: Bytes::from_static(b"hello body"),
            times: Times {
                request: 5,
                response: 7,
            },
            lifetime: 60,
            directives: Directives::default(),
            vary: vec![
                (HeaderName::from_static("accept"), Some("text/html".into())),
                (HeaderName::from_static("x-v"), None),
            ],
            tags: vec![Box::from("a"), Box::from("b")].into_boxed_slice(),
        }
    }

    #[test]
    fn a_file_reads_back_as_it_was_written() {
        let bytes = encode("http://a/x?1", &entry());
        let head = read_head(&bytes, bytes.len() as u64).unwrap();
        assert_eq!(&*head.key, "http://a/x?1");
        assert_eq!(head.tags.len(), 2);
        let (e, key) = decode(bytes).unwrap();
        assert_eq!(&*key, "http://a/x?1");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(&e.body[..], b"hello body");
        assert_eq!(e.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(e.directives.max_age, Some(60));
        assert_eq!((e.times.request, e.times.response, e.lifetime), (5, 7, 60));
        assert_eq!(e.vary, entry().vary);
    }

    #[test]
    fn a_damaged_file_is_an_error_never_a_panic() {
        let good = encode("http://a/x", &entry());
        // Every truncation, and every single flipped byte.
        for n in 0..good.len() {
            assert!(decode(good[..n].to_vec()).is_err(), "truncated to {n}");
            let _ = read_head(&good[..n], n as u64);
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(decode(bad.clone()).is_err(), "byte {i} flipped");
            let _ = read_head(&bad, bad.len() as u64);
        }
        // Padded: the lengths no longer add up.
        let mut padded = good.clone();
        padded.push(0);
        assert!(read_head(&padded, padded.len() as u64).is_err());
        assert!(decode(b"garbage that is long enough to be read".to_vec()).is_err());
        assert!(name_of("k").len() == 32 && is_entry_name(&name_of("k")));
        assert!(!is_entry_name("0123.tmp"));
    }
}
