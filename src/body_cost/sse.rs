//! Follows a `text/event-stream` body as it passes and scans each event's data as one JSON
//! document (see `json.rs`): a path's value is the one from the **last event that carries
//! it**. Events whose data is not complete JSON (`data: [DONE]`, a comment, a cut event) are
//! ignored, as is an event cut by the end of the stream (the SSE rule: an event is dispatched by
//! the blank line after it). Memory is the JSON scan's plus one event's data up to
//! [`MAX_HELD`] bytes, whatever the lines' length.
//!
//! Most events of a token stream cannot carry a path (199 of 200 `delta` chunks have no
//! `usage`), so an event's data is held (up to [`MAX_HELD`] bytes) and scanned at its end only
//! when it may: when it holds a path's first key as a JSON string (`"usage"`) or any backslash
//! (an escaped key could spell it). An event skipped so is one whose scan would have found every
//! path missing or the data malformed — in both cases the event changes nothing. A longer event
//! is scanned as it streams.

use memchr::memmem::Finder;

use super::json::{Found, JsonScan};

/// The longest field name read (`data` is what counts; longer names are other fields).
const MAX_FIELD: usize = 16;
/// The most of one event's data held to decide whether to scan it; a longer event is scanned as
/// it streams.
pub const MAX_HELD: usize = 4096;

pub struct SseScan {
    event: JsonScan,
    /// The value each path took in the last event that carried it.
    latest: Vec<Found>,
    line: Line,
    field: Vec<u8>,
    /// The current event has data lines.
    has_data: bool,
    /// The last byte was a CR (a following LF ends the same line).
    after_cr: bool,
    /// Each path's first key as a JSON string (`"usage"`); `None`: no prefilter (a path without
    /// keys, or the filter turned off).
    needles: Option<Vec<Finder<'static>>>,
    /// The current event's data so far, while it is at most `MAX_HELD` bytes and not streaming.
    held: Vec<u8>,
    /// The current event's data goes straight to the scan (too long to hold, or no prefilter).
    streaming: bool,
    /// How many bytes of a leading byte order mark were read (`BOM_DONE`: the stream's start
    /// is past). The stream is UTF-8 decoded, which drops one leading BOM (WHATWG HTML
    /// §9.2.6); kept, it would make the first line's field `\u{feff}data`, not `data`.
    bom: u8,
}

/// UTF-8's byte order mark.
const BOM: &[u8; 3] = b"\xef\xbb\xbf";
/// [`SseScan::bom`] once the stream's start is past.
const BOM_DONE: u8 = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At a line's start, or reading its field name.
    Field,
    /// Right after `data:` (one space may follow).
    DataStart,
    /// In a `data` line's value: fed to the event's scan.
    Data,
    /// In any other line (comment, other field): skipped.
    Skip,
}

impl SseScan {
    pub fn new(paths: &[&[Box<str>]]) -> SseScan {
        let needles = paths
            .iter()
            .take(64)
            .map(|p| {
                let first = p.first()?;
                let quoted = format!("\"{first}\"");
                Some(Finder::new(quoted.as_bytes()).into_owned())
            })
            .collect::<Option<Vec<_>>>();
        SseScan::with_needles(paths, needles)
    }

    /// A scan of every event, with no prefilter (the reference the prefilter is tested against).
    pub fn unfiltered(paths: &[&[Box<str>]]) -> SseScan {
        SseScan::with_needles(paths, None)
    }

    fn with_needles(paths: &[&[Box<str>]], needles: Option<Vec<Finder<'static>>>) -> SseScan {
        let event = JsonScan::new(paths);
        let latest = vec![Found::Missing; paths.len().min(64)];
        let streaming = needles.is_none();
        SseScan {
            event,
            latest,
            line: Line::Field,
            field: Vec::new(),
            has_data: false,
            after_cr: false,
            needles,
            held: Vec::new(),
            streaming,
            bom: 0,
        }
    }

    /// The next bytes of the current event's data.
    fn data(&mut self, bytes: &[u8]) {
        if self.streaming {
            self.event.feed(bytes);
        } else if self.held.len().saturating_add(bytes.len()) <= MAX_HELD {
            self.held.extend_from_slice(bytes);
        } else {
            self.streaming = true;
            self.event.feed(&self.held);
            self.held.clear();
            self.event.feed(bytes);
        }
    }

    /// Whether held data may carry a path (see the module's text).
    fn may_carry(&self, data: &[u8]) -> bool {
        match &self.needles {
            None => true,
            Some(needles) => {
                memchr::memchr(b'\\', data).is_some()
                    || needles.iter().any(|f| f.find(data).is_some())
            }
        }
    }

    /// Each path's value from the last (complete) event that carried it.
    pub fn results(&self) -> Vec<Found> {
        self.latest.clone()
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        // A leading byte order mark, perhaps split over pieces, is dropped; bytes that start
        // like one and then differ are the stream's own, fed as they came.
        while self.bom < BOM_DONE {
            let Some((&b, tail)) = rest.split_first() else {
                return;
            };
            if BOM.get(usize::from(self.bom)) == Some(&b) {
                self.bom += 1;
                rest = tail;
                if self.bom == BOM_DONE {
                    break;
                }
            } else {
                let matched = usize::from(self.bom);
                self.bom = BOM_DONE;
                self.scan(BOM.get(..matched).unwrap_or_default());
            }
        }
        self.scan(rest);
    }

    fn scan(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some((&b, tail)) = rest.split_first() {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    rest = tail;
                    continue;
                }
            }
            if self.line == Line::Data {
                // A run of data up to the line's end goes to the scan at once.
                let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                let (run, after) = rest.split_at(end);
                self.data(run);
                rest = after;
                if let Some((&eol, after)) = rest.split_first() {
                    self.end_line(eol);
                    rest = after;
                }
                continue;
            }
            rest = tail;
            if b == b'\n' || b == b'\r' {
                self.end_line(b);
                continue;
            }
            match self.line {
                Line::Field => {
                    if b == b':' {
                        self.line = if self.field == b"data" {
                            self.start_data();
                            Line::DataStart
                        } else {
                            Line::Skip
                        };
                    } else if self.field.len() < MAX_FIELD {
                        self.field.push(b);
                    } else {
                        self.line = Line::Skip;
                    }
                }
                Line::DataStart => {
                    self.line = Line::Data;
                    if b != b' ' {
                        self.data(&[b]);
                    }
                }
                Line::Data | Line::Skip => {}
            }
        }
    }

    fn start_data(&mut self) {
        if self.has_data {
            // Data lines of one event are joined by a line feed: JSON whitespace.
            self.data(b"\n");
        }
        self.has_data = true;
    }

    fn end_line(&mut self, eol: u8) {
        self.after_cr = eol == b'\r';
        match self.line {
            // `data` alone on its line is a data line with an empty value.
            Line::Field if self.field == b"data" => self.start_data(),
            Line::Field if self.field.is_empty() => self.dispatch(),
            _ => {}
        }
        self.field.clear();
        self.line = Line::Field;
    }

    /// A blank line: the event ends.
    fn dispatch(&mut self) {
        if !self.has_data {
            return;
        }
        self.has_data = false;
        let filtered = self.needles.is_some();
        if !self.streaming {
            let held = std::mem::take(&mut self.held);
            let scan = self.may_carry(&held);
            if scan {
                self.event.feed(&held);
            }
            // The allocation is kept for the next event.
            self.held = held;
            self.held.clear();
            if !scan {
                return;
            }
        }
        self.streaming = !filtered;
        self.event.finish();
        if let Some(found) = self.event.complete() {
            for (l, f) in self.latest.iter_mut().zip(found) {
                if *f != Found::Missing {
                    *l = *f;
                }
            }
        }
        self.event.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stream: &str, paths: &[&str]) -> Vec<Found> {
        let owned: Vec<Vec<Box<str>>> = paths
            .iter()
            .map(|p| p.split('.').map(Box::from).collect())
            .collect();
        let refs: Vec<&[Box<str>]> = owned.iter().map(|p| p.as_slice()).collect();
        let mut last = None;
        for filtered in [true, false] {
            for chunk in [usize::MAX, 1, 2, 5] {
                let mut s = if filtered {
                    SseScan::new(&refs)
                } else {
                    SseScan::unfiltered(&refs)
                };
                for c in stream.as_bytes().chunks(chunk.min(stream.len().max(1))) {
                    s.feed(c);
                }
                let r = s.results();
                if let Some(l) = &last {
                    assert_eq!(&r, l, "split in {chunk}s, filtered: {filtered}");
                }
                last = Some(r);
            }
        }
        last.unwrap_or_default()
    }

    #[test]
    fn the_last_event_that_carries_the_path_counts() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\n\
                      : a comment\n\
                      event: message_delta\n\
                      data: {\"usage\":{\"output_tokens\":5}}\n\n\
                      data: {\"usage\":\r\ndata: {\"output_tokens\":9,\"input_tokens\":3}}\r\n\r\n\
                      data: {\"choices\":[]}\n\n\
                      data: [DONE]\n\n";
        assert_eq!(
            scan(
                stream,
                &["usage.output_tokens", "usage.input_tokens", "usage.other"]
            ),
            vec![Found::Value(9), Found::Value(3), Found::Missing]
        );
    }

    #[test]
    fn a_cut_event_and_broken_events_are_ignored() {
        let stream = "data: {\"usage\":{\"n\":4}}\n\ndata: {\"usage\":{\"n\":8}";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(4)]);
        let stream = "data: {\"usage\":{\"n\":4}}\n\ndata: {\"usage\":{\"n\":8}}}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(4)]);
        let stream = "data: {\"usage\":{\"n\":-4}}\r\r";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Malformed]);
        assert_eq!(scan("", &["usage.n"]), vec![Found::Missing]);
        // Long lines of other fields are skipped without being kept.
        let long = format!(
            "{}: x\nid: {}\ndata: {{\"usage\":{{\"n\":2}}}}\n\n",
            "y".repeat(5000),
            "z".repeat(5000)
        );
        assert_eq!(scan(&long, &["usage.n"]), vec![Found::Value(2)]);
    }

    #[test]
    fn the_prefilter_skips_only_events_that_change_nothing() {
        // An escaped key still counts (the backslash sends the event to the scan).
        let stream = "data: {\"us\\u0061ge\":{\"n\":7}}\n\ndata: {\"other\":1}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(7)]);
        // The key's name inside a string value is not a key: the scan decides.
        let stream = "data: {\"usage\":{\"n\":3}}\n\ndata: {\"x\":\"\\\"usage\\\"\"}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(3)]);
        // An event longer than what is held is scanned as it streams, before and after.
        let pad = "p".repeat(MAX_HELD * 2);
        let stream = format!(
            "data: {{\"usage\":{{\"n\":1}}}}\n\n\
             data: {{\"pad\":\"{pad}\",\n\
             data: \"usage\":{{\"n\":5}}}}\n\n\
             data: {{\"pad\":\"{pad}\"}}\n\n\
             data: {{\"delta\":1}}\n\n"
        );
        assert_eq!(scan(&stream, &["usage.n"]), vec![Found::Value(5)]);
        // A path's second key alone does not make an event scanned, and need not.
        let stream = "data: {\"usage\":{\"n\":2}}\n\ndata: {\"n\":9}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(2)]);
    }

    /// A stream may start with a UTF-8 byte order mark, which the event stream parser drops
    /// (WHATWG HTML §9.2.6: the stream is UTF-8 decoded, a leading BOM removed): the first
    /// event's `data` is read, whatever the chunks the mark is split over. A mark anywhere else
    /// (or a partial one) is no mark.
    #[test]
    fn a_leading_byte_order_mark_is_dropped() {
        let stream = "\u{feff}data: {\"usage\":{\"n\":4}}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(4)]);
        // Only one mark is dropped: a second makes the first line's field another name.
        let stream = "\u{feff}\u{feff}data: {\"usage\":{\"n\":4}}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Missing]);
        let stream = "data: {\"usage\":{\"n\":4}}\n\n\u{feff}data: {\"usage\":{\"n\":6}}\n\n";
        assert_eq!(scan(stream, &["usage.n"]), vec![Found::Value(4)]);
        // Two bytes of a mark and then data: not a mark; the line's field is not `data`.
        let mut s = SseScan::new(&[&["usage".into(), "n".into()][..]]);
        s.feed(b"\xef\xbbdata: {\"usage\":{\"n\":4}}\n\n");
        assert_eq!(s.results(), vec![Found::Missing]);
        s.feed(b"data: {\"usage\":{\"n\":5}}\n\n");
        assert_eq!(s.results(), vec![Found::Value(5)]);
    }
}
