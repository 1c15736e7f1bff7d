//! The little of RESP2 the store speaks: commands as arrays of bulk strings out, and replies
//! (integers, arrays of integers, simple strings, errors, bulk strings) in.
//!
//! The parser is incremental: it reports `None` until a whole reply is in the buffer, so a reply
//! split over several reads is parsed once complete. Anything a server could send is handled
//! without panicking; a reply of an unexpected shape is an error the caller turns into a
//! `StoreError` (and a reconnect: after a protocol error the stream's framing is not trusted).

/// A command being written: arguments are appended as bulk strings, the header at the end.
#[derive(Debug, Default)]
pub struct Command {
    body: Vec<u8>,
    args: usize,
}

impl Command {
    pub fn clear(&mut self) {
        self.body.clear();
        self.args = 0;
    }

    /// Appends one argument.
    pub fn arg(&mut self, a: &[u8]) {
        self.body.push(b'$');
        push_decimal(&mut self.body, a.len() as u64);
        self.body.extend_from_slice(b"\r\n");
        self.body.extend_from_slice(a);
        self.body.extend_from_slice(b"\r\n");
        self.args += 1;
    }

    /// Appends an integer argument (in decimal).
    pub fn int(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let len = decimal(&mut digits, n);
        self.arg(&digits[20 - len..]);
    }

    /// Appends the whole command (array header, then the arguments) to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.push(b'*');
        push_decimal(out, self.args as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
    }

    /// Appends the command `head… args…` to `out` (the head's arguments first).
    pub fn write_with_head(&self, head: &[&[u8]], out: &mut Vec<u8>) {
        out.push(b'*');
        push_decimal(out, (self.args + head.len()) as u64);
        out.extend_from_slice(b"\r\n");
        for h in head {
            out.push(b'$');
            push_decimal(out, h.len() as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(h);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(&self.body);
    }

    /// The arguments, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut rest = &self.body[..];
        std::iter::from_fn(move || {
            // The body is `$<len>\r\n<bytes>\r\n` per argument, as `arg` wrote it.
            let header_end = rest.windows(2).position(|w| w == b"\r\n")?;
            let len: usize = std::str::from_utf8(rest.get(1..header_end)?)
                .ok()?
                .parse()
                .ok()?;
            let start = header_end + 2;
            let arg = rest.get(start..start.checked_add(len)?)?;
            rest = rest.get(start + len + 2..)?;
            Some(arg)
        })
    }

    pub fn args(&self) -> usize {
        self.args
    }

    /// Appends another command's arguments after this one's.
    pub fn append(&mut self, other: &Command) {
        self.body.extend_from_slice(&other.body);
        self.args += other.args;
    }
}

/// Writes `n` in decimal at the end of `digits`; returns how many digits.
fn decimal(digits: &mut [u8; 20], mut n: u64) -> usize {
    let mut i = digits.len();
    loop {
        i -= 1;
        // `n % 10` < 10: the cast cannot truncate.
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return digits.len() - i;
        }
    }
}

fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let len = decimal(&mut digits, n);
    out.extend_from_slice(&digits[20 - len..]);
}

/// One parsed reply. Arrays of integers land in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An array of this many integers (appended to the caller's `ints`).
    Ints(usize),
    /// A simple string (`+PONG`, `+OK`) or a bulk string.
    Text(String),
    /// A single integer.
    Int(i64),
    /// A nil bulk string or array.
    Nil,
    /// An error reply (`-NOSCRIPT …`, `-ERR …`).
    Error(String),
}

/// The server sent something that is not RESP2, or not a reply this client expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed reply from Redis: {0}")]
pub struct ProtocolError(pub &'static str);

/// How an array's bulk strings (`None` for a nil one) become integers, appended to the
/// caller's buffer: the decide script's runs reply holds keys' states
/// ([`super::replay::raw_state`]).
pub type Bulk = fn(Option<&[u8]>, &mut Vec<i64>) -> Result<(), ProtocolError>;

/// Refuses any bulk string in an array: replies of integers only.
fn integers_only(_: Option<&[u8]>, _: &mut Vec<i64>) -> Result<(), ProtocolError> {
    Err(ProtocolError("an array of something else than integers"))
}

/// Parses one reply from the start of `buf`: `Ok(None)` until it is complete, else the reply and
/// how many bytes it took. Integers of an array are appended to `ints`.
pub fn parse(buf: &[u8], ints: &mut Vec<i64>) -> Result<Option<(Reply, usize)>, ProtocolError> {
    parse_with(buf, ints, integers_only)
}

/// [`parse`], an array's bulk strings taken by `bulk`; [`Reply::Ints`] then counts the
/// integers appended.
pub fn parse_with(
    buf: &[u8],
    ints: &mut Vec<i64>,
    bulk: Bulk,
) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let mark = ints.len();
    let result = parse_at(buf, ints, bulk);
    if !matches!(result, Ok(Some(_))) {
        ints.truncate(mark);
    }
    result
}

/// The longest reply line accepted (a simple string, an error, a number), without its `\r\n`:
/// a longer one is not one of ours, and is refused whether or not its end has arrived, so that
/// how the bytes were cut into reads never changes the answer.
const MAX_LINE: usize = 4096;

/// The line at the start of `buf` and the bytes it takes with its `\r\n`; `None` until its end
/// is in; an error once it is longer than [`MAX_LINE`].
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let window = &buf[..buf.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some((&buf[..end], end + 2))),
        None if buf.len() >= MAX_LINE + 2 => Err(ProtocolError("a reply line too long")),
        None => Ok(None),
    }
}

fn number(text: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or(ProtocolError("not a number"))
}

/// The longest line or bulk string accepted (a reply larger than this is not one of ours).
const MAX_LEN: i64 = 64 << 20;

/// A bulk string's bytes (`None` for a nil one) and where it ends with its `\r\n`.
type BulkString<'b> = (Option<&'b [u8]>, usize);

/// The bulk string whose header line (`$<len>`, its number in `text`) ends at `at`; `Ok(None)`
/// until it is all in.
fn bulk_string<'b>(
    buf: &'b [u8],
    at: usize,
    text: &[u8],
) -> Result<Option<BulkString<'b>>, ProtocolError> {
    let len = number(text)?;
    if len < 0 {
        return Ok(Some((None, at)));
    }
    if len > MAX_LEN {
        return Err(ProtocolError("a bulk string too long"));
    }
    let len = usize::try_from(len).map_err(|_| ProtocolError("a bulk string too long"))?;
    let end = at
        .checked_add(len)
        .and_then(|e| e.checked_add(2))
        .ok_or(ProtocolError("a bulk string too long"))?;
    if buf.len() < end {
        return Ok(None);
    }
    if &buf[end - 2..end] != b"\r\n" {
        return Err(ProtocolError("a bulk string without its end"));
    }
    Ok(Some((Some(&buf[at..end - 2]), end)))
}

fn parse_at(
    buf: &[u8],
    ints: &mut Vec<i64>,
    bulk: Bulk,
) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    let Some((text, used)) = line(&buf[1..])? else {
        return Ok(None);
    };
    let used = used + 1;
    match kind {
        b'+' => Ok(Some((
            Reply::Text(String::from_utf8_lossy(text).into_owned()),
            used,
        ))),
        b'-' => Ok(Some((
            Reply::Error(String::from_utf8_lossy(text).into_owned()),
            used,
        ))),
        b':' => Ok(Some((Reply::Int(number(text)?), used))),
        b'$' => Ok(bulk_string(buf, used, text)?.map(|(value, end)| {
            let reply = match value {
                Some(v) => Reply::Text(String::from_utf8_lossy(v).into_owned()),
                None => Reply::Nil,
            };
            (reply, end)
        })),
        b'*' => {
            let n = number(text)?;
            if n < 0 {
                return Ok(Some((Reply::Nil, used)));
            }
            if n > MAX_LEN {
                return Err(ProtocolError("an array too long"));
            }
            let n = usize::try_from(n).map_err(|_| ProtocolError("an array too long"))?;
            let first = ints.len();
            let mut at = used;
            for _ in 0..n {
                let rest = &buf[at..];
                let Some(&kind) = rest.first() else {
                    return Ok(None);
                };
                if kind != b':' && kind != b'$' {
                    return Err(ProtocolError("an array of something else than integers"));
                }
                let Some((text, len)) = line(&rest[1..])? else {
                    return Ok(None);
                };
                at += 1 + len;
                if kind == b':' {
                    ints.push(number(text)?);
                    continue;
                }
                let Some((value, end)) = bulk_string(buf, at, text)? else {
                    return Ok(None);
                };
                bulk(value, ints)?;
                at = end;
            }
            Ok(Some((Reply::Ints(ints.len() - first), at)))
        }
        _ => Err(ProtocolError("an unknown reply type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_an_array_of_bulk_strings() {
        let mut c = Command::default();
        c.arg(b"EVALSHA");
        c.int(0);
        c.int(18446744073709551615);
        c.arg(b"");
        let mut out = Vec::new();
        c.write_to(&mut out);
        let back: Vec<&[u8]> = c.iter().collect();
        assert_eq!(
            back,
            vec![&b"EVALSHA"[..], b"0", b"18446744073709551615", b""]
        );
        assert_eq!(
            out,
            b"*4\r\n$7\r\nEVALSHA\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn replies_parse_once_complete_at_any_split() {
        let wire: &[u8] = b"*3\r\n:1\r\n:-20\r\n:300\r\n+PONG\r\n-NOSCRIPT No matching script\r\n$3\r\nabc\r\n$-1\r\n:7\r\n";
        for split in 0..wire.len() {
            let mut ints = Vec::new();
            let mut replies = Vec::new();
            let mut buf = wire[..split].to_vec();
            let mut fed = split;
            loop {
                match parse(&buf, &mut ints).unwrap() {
                    Some((r, used)) => {
                        replies.push(r);
                        buf.drain(..used);
                    }
                    None if fed < wire.len() => {
                        buf.push(wire[fed]);
                        fed += 1;
                    }
                    None => break,
                }
            }
            assert_eq!(
                replies,
                vec![
                    Reply::Ints(3),
                    Reply::Text("PONG".into()),
                    Reply::Error("NOSCRIPT No matching script".into()),
                    Reply::Text("abc".into()),
                    Reply::Nil,
                    Reply::Int(7),
                ],
                "split at {split}"
            );
            assert_eq!(ints, vec![1, -20, 300]);
        }
    }

    /// The decide script's runs reply: keys' values as bulk strings (nil for a missing key),
    /// then `now`; each value becomes 4 integers through the caller's `Bulk`.
    #[test]
    fn a_runs_reply_parses_once_complete_at_any_split() {
        let mut state = vec![1u8];
        for x in [1_700_000_000_000_000f64, 5.0] {
            state.extend_from_slice(&x.to_le_bytes());
        }
        let wire = [
            &b"*3\r\n$17\r\n"[..],
            &state,
            b"\r\n$-1\r\n:1700000000000123\r\n",
        ]
        .concat();
        for split in 0..wire.len() {
            let mut ints = Vec::new();
            let mut got = None;
            for end in split..=wire.len() {
                if let Some(r) =
                    parse_with(&wire[..end], &mut ints, super::super::replay::raw_state).unwrap()
                {
                    got = Some(r);
                    break;
                }
                assert!(ints.is_empty(), "nothing kept from an incomplete reply");
            }
            assert_eq!(got, Some((Reply::Ints(9), wire.len())), "split at {split}");
            assert_eq!(
                ints,
                [
                    1,
                    1_700_000_000_000_000,
                    5,
                    0,
                    0,
                    0,
                    0,
                    0,
                    1_700_000_000_000_123
                ]
            );
        }
        // Without a `Bulk`, an array of something else than integers is refused.
        assert!(parse(&wire, &mut Vec::new()).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut ints = Vec::new();
        for bad in [
            &b"?\r\n"[..],
            b"*2\r\n+x\r\n",
            b":abc\r\n",
            b"$99999999999999\r\n",
            b"*99999999999999\r\n",
            b"*1\r\n:99999999999999999999999\r\n",
        ] {
            assert!(parse(bad, &mut ints).is_err(), "{bad:?}");
        }
        assert!(ints.is_empty());
        assert_eq!(
            parse(&[b'+'; 5000], &mut ints),
            Err(ProtocolError("a reply line too long"))
        );
    }

    /// Found by the fuzz target `resp_decode`: a simple string longer than 4096 bytes parsed
    /// when it arrived in one read, but was refused ("a reply line without an end") when it
    /// arrived in several, since the limit looked at the buffer only while the line's end was
    /// missing; an integer of an array had no limit at all. A line's limit is now the line's,
    /// however the bytes arrive.
    #[test]
    fn a_line_over_the_limit_is_refused_however_it_arrives() {
        let mut ints = Vec::new();
        let long = |kind: &[u8], n: usize| [kind, &vec![b'1'; n][..], b"\r\n"].concat();
        for wire in [
            long(b"+", MAX_LINE + 1),
            long(b"-", MAX_LINE + 1),
            long(b":", MAX_LINE + 1),
            [&b"*2\r\n:1\r\n"[..], &long(b":", MAX_LINE + 1)].concat(),
        ] {
            assert_eq!(
                parse(&wire, &mut ints),
                Err(ProtocolError("a reply line too long")),
                "whole"
            );
            // Without the line's last byte: its end has not arrived.
            let cut = &wire[..wire.len() - 1];
            assert_eq!(
                parse(cut, &mut ints),
                Err(ProtocolError("a reply line too long")),
                "its start"
            );
        }
        assert!(ints.is_empty());
        // At the limit, a line is a reply.
        let wire = long(b"+", MAX_LINE);
        assert_eq!(
            parse(&wire, &mut ints),
            Ok(Some((Reply::Text("1".repeat(MAX_LINE)), wire.len())))
        );
        assert_eq!(parse(&wire[..MAX_LINE], &mut ints), Ok(None));
    }
}
