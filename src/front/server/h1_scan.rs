//! Follows HTTP/1 request framing over the bytes read from a client, the way hyper's parser
//! and chunked decoder do, to find the request heads that carry both `Content-Length` and
//! `Transfer-Encoding` (hyper serves those as chunked and drops `Content-Length`).
//!
//! It only needs to agree with hyper on where each request head starts (which also tells the
//! connection task when a head is being read). Whenever it meets something it does not
//! model it stops following ("opaque"), and that is only ever where the connection serves no
//! further HTTP/1 request, since a request it did not see would skip the check:
//! - an input hyper rejects (an oversized or malformed head, a malformed chunk): hyper closes
//!   the connection;
//! - a head with both `Content-Length` and `Transfer-Encoding`: the handler answers 400 and
//!   closes;
//! - `CONNECT`: the handler refuses it and closes (the connection never becomes a tunnel);
//! - the HTTP/2 preface: the connection is HTTP/2 from then on, or hyper rejects it.
//!
//! After an `Upgrade` request it keeps following: if the connection does switch, the
//! connection state says so and the scanner is dropped.

use crate::front::http1::framing::{head_end, step, Chunk, Framing, FramingFields};

/// The framing scanner of one connection.
pub struct Scan {
    state: State,
    head: Vec<u8>,
    /// Empty lines came before the next request line: the wait for a head has begun.
    blank: bool,
    max_head: usize,
    heads: u64,
}

enum State {
    Head,
    Fixed(u64),
    Chunked(Chunk),
    Opaque,
}

/// What a request head means for the bytes after it.
enum Head {
    /// A body of this framing follows, then the next head.
    Body { chunked: bool, length: u64 },
    /// Stop following (see the module docs).
    Opaque,
}

impl Scan {
    pub fn new(max_head: usize) -> Scan {
        Scan {
            state: State::Head,
            head: Vec::new(),
            blank: false,
            max_head,
            heads: 0,
        }
    }

    /// Whether the scanner stopped following for good.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Opaque)
    }

    /// Whether part of a request head has been read, but not all of it. Empty lines before a
    /// request line count: they belong to the wait for a head (else a client could hold an
    /// idle connection open with a `CRLF` now and then).
    pub fn in_head(&self) -> bool {
        matches!(self.state, State::Head) && (self.blank || !self.head.is_empty())
    }

    /// Request heads seen so far.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Feeds bytes as read; returns the index (0-based, counting request heads on this
    /// connection) of a head with both `Content-Length` and `Transfer-Encoding`.
    pub fn feed(&mut self, mut input: &[u8]) -> Option<u64> {
        let mut found = None;
        while !input.is_empty() {
            match &mut self.state {
                State::Opaque => break,
                State::Head => {
                    if self.head.is_empty() {
                        // Empty lines before a request line are skipped (RFC 9112 §2.2).
                        let n = input
                            .iter()
                            .take_while(|b| matches!(b, b'\r' | b'\n'))
                            .count();
                        input = &input[n..];
                        self.blank |= n > 0;
                        if input.is_empty() {
                            break;
                        }
                        // The common case, a whole head in one read: classified where it
                        // lies, never copied.
                        if let Some(end) = head_end(input, 0) {
                            let (head, conflicting) = classify(&input[..end]);
                            input = &input[end..];
                            if let Some(index) = self.head_read(head, conflicting) {
                                found = Some(index);
                            }
                            continue;
                        }
                    }
                    let before = self.head.len();
                    let from = before.saturating_sub(2);
                    self.head.extend_from_slice(input);
                    let Some(end) = head_end(&self.head, from) else {
                        if self.head.len() > self.max_head {
                            self.state = State::Opaque;
                            self.head = Vec::new();
                        }
                        break;
                    };
                    input = &input[end - before..];
                    self.head.truncate(end);
                    let (head, conflicting) = classify(&self.head);
                    self.head.clear();
                    if let Some(index) = self.head_read(head, conflicting) {
                        found = Some(index);
                    }
                }
                State::Fixed(left) => {
                    let n = input
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    input = &input[n..];
                    if *left == 0 {
                        self.state = State::Head;
                    }
                }
                State::Chunked(chunk) => {
                    if let Chunk::Data(left) = chunk {
                        let n = input
                            .len()
                            .min(usize::try_from(*left).unwrap_or(usize::MAX));
                        *left -= n as u64;
                        input = &input[n..];
                        if *left == 0 {
                            *chunk = Chunk::DataCr;
                        }
                        continue;
                    }
                    let b = input[0];
                    input = &input[1..];
                    self.state = match step(*chunk, b) {
                        Some(None) => State::Head,
                        Some(Some(next)) => State::Chunked(next),
                        None => State::Opaque,
                    };
                }
            }
        }
        found
    }
}

impl Scan {
    /// A whole head was read: counts it and follows its body. Returns its index when it
    /// carries both `Content-Length` and `Transfer-Encoding`.
    fn head_read(&mut self, head: Head, conflicting: bool) -> Option<u64> {
        let index = self.heads;
        self.heads += 1;
        self.blank = false;
        self.state = match head {
            Head::Opaque => State::Opaque,
            Head::Body { chunked: true, .. } => State::Chunked(Chunk::Start),
            Head::Body { length: 0, .. } => State::Head,
            Head::Body { length, .. } => State::Fixed(length),
        };
        conflicting.then_some(index)
    }
}

/// What a complete head means, as hyper reads it; and whether it carries both
/// `Content-Length` and `Transfer-Encoding`.
fn classify(head: &[u8]) -> (Head, bool) {
    let mut lines = head
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let Some(request_line) = lines.next() else {
        return (Head::Opaque, false);
    };
    let mut parts = request_line.split(|b| *b == b' ');
    let method = parts.next().unwrap_or_default();
    let version = parts.next_back().unwrap_or_default();
    let http10 = match version {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        _ => return (Head::Opaque, false),
    };
    let opaque = method == b"CONNECT";
    let mut fields = FramingFields::default();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if matches!(line.first(), Some(b' ' | b'\t')) {
            return (Head::Opaque, false);
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return (Head::Opaque, false);
        };
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|b| matches!(b, b' ' | b'\t')) {
            return (Head::Opaque, false);
        }
        fields.field(name, &line[colon + 1..], http10);
    }
    match fields.framing() {
        Framing::Invalid => (Head::Opaque, false),
        // hyper serves nothing after a request with both headers (it closes the connection).
        Framing::Conflicting => (Head::Opaque, true),
        _ if opaque => (Head::Opaque, false),
        Framing::Body { chunked, length } => (Head::Body { chunked, length }, false),
    }
}

#[cfg(test)]
mod tests {
    use super::Scan;

    fn feed_all(parts: &[&[u8]]) -> (Vec<u64>, bool) {
        let mut s = Scan::new(8192);
        let found = parts.iter().filter_map(|p| s.feed(p)).collect();
        (found, s.is_done())
    }

    #[test]
    fn finds_cl_te_in_the_first_head() {
        let req = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(feed_all(&[req]), (vec![0], true));
    }

    #[test]
    fn follows_fixed_and_chunked_bodies_to_a_later_head() {
        let stream: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
            GET /b HTTP/1.1\r\nHost: x\r\n\r\n\
            POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n\
            POST /d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n";
        assert_eq!(feed_all(&[stream]), (vec![3], true));
        // The same bytes one at a time.
        let mut s = Scan::new(8192);
        let found: Vec<u64> = stream.chunks(1).filter_map(|b| s.feed(b)).collect();
        assert_eq!(found, vec![3]);
    }

    #[test]
    fn body_bytes_that_look_like_a_head_are_not_one() {
        let body = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let head = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (found, done) = feed_all(&[head.as_bytes(), body, b"GET / HTTP/1.1\r\n\r\n"]);
        assert!(found.is_empty());
        assert!(!done);
    }

    #[test]
    fn knows_when_a_head_is_being_read() {
        let mut s = Scan::new(8192);
        assert!(!s.in_head());
        s.feed(b"\r\n");
        assert!(s.in_head(), "empty lines before a head begin it");
        s.feed(b"GET / HTTP/1.1\r\nHo");
        assert!(s.in_head());
        s.feed(b"st: x\r\nContent-Length: 3\r\n\r\nab");
        assert!(!s.in_head() && s.heads() == 1);
        s.feed(b"cGET /next HTTP/1.1\r\n");
        assert!(s.in_head() && s.heads() == 1);
        s.feed(b"\r\nGET /third");
        assert!(s.in_head() && s.heads() == 2);
        s.feed(b" HTTP/1.1\r\n\r\n");
        assert!(!s.in_head() && s.heads() == 3);
        s.feed(b"\r\n\r\n");
        assert!(s.in_head() && s.heads() == 3);
    }

    #[test]
    fn keeps_following_after_an_upgrade_request() {
        let (found, done) = feed_all(&[
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ]);
        assert_eq!((found, done), (vec![1], true));
    }

    #[test]
    fn stops_following_what_it_does_not_model() {
        for req in [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            b"CONNECT h:1 HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            let (found, done) = feed_all(&[req]);
            assert!(found.is_empty() && done, "{}", String::from_utf8_lossy(req));
        }
    }
}
