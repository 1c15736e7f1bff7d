//! How deeply a YAML text nests its flow collections (`[…]`, `{…}`), read before the parser.
//!
//! libyaml (which `serde_norway` wraps) checks every pending simple key at each token, and a
//! flow collection keeps one per level: a text of nested `[`/`{` parses in time quadratic in its
//! depth — 600 KB of them took more than 15 s, a 4 MiB file hours — before serde's own depth
//! limit (128) ever sees the events. [`check`] reads the text once, in linear time, and refuses
//! one nested deeper than asked, so any file is refused or parsed in a fraction of a second.
//!
//! It is a scanner, not a parser: it follows what it must to tell a flow indicator from text —
//! quoted scalars (over lines too), comments, block scalars (`|`, `>`), plain scalars (in which
//! a block context's `[` is text), anchors and tags. What it cannot tell (a text that is not
//! YAML) it counts generously; the parser refuses such a text anyway. Used by the rate limit
//! service's YAML files (`crate::rls::yaml`) and usable by any reader of outside YAML.

/// The deepest flow nesting a configuration has any use for: a descriptor tree of the deepest
/// kind the service accepts (16 levels), written all in flow style, is about 34.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Why a text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: flow collections ([…], {{…}}) nested deeper than {max}")]
pub struct TooDeep {
    /// The line (1-based) where the nesting passes the bound.
    pub line: usize,
    pub max: usize,
}

/// Refuses `text` if its flow collections nest deeper than `max`.
pub fn check(text: &str, max: usize) -> Result<(), TooDeep> {
    Scanner {
        s: text.as_bytes(),
        i: 0,
        line: 1,
        line_start: 0,
        depth: 0,
        max,
    }
    .run()
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
    line: usize,
    /// Where the current line starts.
    line_start: usize,
    depth: usize,
    max: usize,
}

impl Scanner<'_> {
    fn peek(&self, at: usize) -> Option<u8> {
        self.s.get(at).copied()
    }

    /// Whether the byte at `at` ends an indicator (`- `, `: `, `? `): a space, a tab, a line
    /// end or the end of the text; in a flow context a flow indicator too.
    fn ends_indicator(&self, at: usize) -> bool {
        match self.peek(at) {
            None | Some(b' ' | b'\t' | b'\r' | b'\n') => true,
            Some(b',' | b'[' | b']' | b'{' | b'}') => self.depth > 0,
            _ => false,
        }
    }

    fn newline(&mut self) {
        self.line += 1;
        self.i += 1;
        self.line_start = self.i;
    }

    /// The current line's indentation (spaces before its first other byte).
    fn indent(&self) -> usize {
        self.s[self.line_start..]
            .iter()
            .take_while(|&&b| b == b' ')
            .count()
    }

    fn skip_to_eol(&mut self) {
        while let Some(b) = self.peek(self.i) {
            if b == b'\n' {
                return;
            }
            self.i += 1;
        }
    }

    fn open(&mut self) -> Result<(), TooDeep> {
        self.depth += 1;
        if self.depth > self.max {
            return Err(TooDeep {
                line: self.line,
                max: self.max,
            });
        }
        Ok(())
    }

    fn run(mut self) -> Result<(), TooDeep> {
        // Whether a node may start here (a line's start, after an indicator, `[`, `{`, `,`).
        let mut node = true;
        while let Some(b) = self.peek(self.i) {
            match b {
                b'\n' => {
                    self.newline();
                    node = true;
                }
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'#' if self.i == self.line_start
                    || matches!(self.s.get(self.i.wrapping_sub(1)), Some(b' ' | b'\t')) =>
                {
                    self.skip_to_eol()
                }
                // In a flow context a bracket is always an indicator (as libyaml's scanner
                // reads it), wherever it stands.
                b'[' | b'{' if node || self.depth > 0 => {
                    self.open()?;
                    self.i += 1;
                }
                b']' | b'}' if self.depth > 0 => {
                    self.depth -= 1;
                    self.i += 1;
                    node = false;
                }
                b',' if self.depth > 0 => {
                    self.i += 1;
                    node = true;
                }
                b'-' | b'?' | b':' if self.ends_indicator(self.i + 1) => {
                    self.i += 1;
                    node = true;
                }
                // `"a":1` in a flow context: a key's colon right after a quoted key.
                b':' if !node && self.depth > 0 => {
                    self.i += 1;
                    node = true;
                }
                b'\'' if node => {
                    self.single_quoted();
                    node = false;
                }
                b'"' if node => {
                    self.double_quoted();
                    node = false;
                }
                b'&' | b'!' if node => {
                    // An anchor or a tag: the node follows it.
                    while let Some(c) = self.peek(self.i) {
                        if matches!(c, b' ' | b'\t' | b'\r' | b'\n') {
                            break;
                        }
                        self.i += 1;
                    }
                }
                b'|' | b'>' if node && self.depth == 0 => self.block_scalar(),
                _ => {
                    self.plain();
                    node = false;
                }
            }
        }
        Ok(())
    }

    /// `'…'` (`''` is a quote), over lines.
    fn single_quoted(&mut self) {
        self.i += 1;
        while let Some(b) = self.peek(self.i) {
            match b {
                b'\'' if self.peek(self.i + 1) == Some(b'\'') => self.i += 2,
                b'\'' => {
                    self.i += 1;
                    return;
                }
                b'\n' => self.newline(),
                _ => self.i += 1,
            }
        }
    }

    /// `"…"` (`\` escapes the next byte), over lines.
    fn double_quoted(&mut self) {
        self.i += 1;
        while let Some(b) = self.peek(self.i) {
            match b {
                b'\\' if self.peek(self.i + 1) == Some(b'\n') => {
                    self.i += 1;
                    self.newline();
                }
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return;
                }
                b'\n' => self.newline(),
                _ => self.i += 1,
            }
        }
    }

    /// `|` or `>`: the rest of the line, then every line blank or indented more than this one.
    fn block_scalar(&mut self) {
        let indent = self.indent();
        self.skip_to_eol();
        while self.peek(self.i) == Some(b'\n') {
            let next = self.i + 1;
            let spaces = self.s[next.min(self.s.len())..]
                .iter()
                .take_while(|&&b| b == b' ')
                .count();
            let blank = matches!(self.peek(next + spaces), None | Some(b'\n' | b'\r'));
            if !blank && spaces <= indent {
                return;
            }
            self.newline();
            self.skip_to_eol();
        }
    }

    /// A plain scalar: to the line's end, a `: ` or ` #`, and in a flow context a flow
    /// indicator (which a block context's plain scalar may hold as text).
    fn plain(&mut self) {
        self.i += 1;
        while let Some(b) = self.peek(self.i) {
            match b {
                b'\n' => return,
                b':' if self.ends_indicator(self.i + 1) => return,
                b'#' if matches!(self.s.get(self.i - 1), Some(b' ' | b'\t')) => return,
                b',' | b'[' | b']' | b'{' | b'}' if self.depth > 0 => return,
                _ => self.i += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str, max: usize) -> bool {
        check(text, max).is_ok()
    }

    #[test]
    fn flow_nesting_is_counted() {
        assert!(depth_ok("a: [[1, 2], {b: [3]}]\n", 3));
        assert!(!depth_ok("a: [[1, 2], {b: [3]}]\n", 2));
        assert!(depth_ok("- [a]\n- {x: y}\n- &anchor [1]\n- !!seq [1]\n", 1));
        assert!(!depth_ok("[[[[\n", 3));
        assert_eq!(
            check("a: 1\nb: [[[x]]]\n", 2),
            Err(TooDeep { line: 2, max: 2 })
        );
        // JSON is YAML.
        assert!(!depth_ok("{\"a\":[{\"b\":[1]}]}", 3));
        assert!(depth_ok("{\"a\":[{\"b\":[1]}]}", 4));
    }

    #[test]
    fn brackets_in_text_are_not_nesting() {
        let text = "\
a: x[[[[y
b: '[[[[' # [[[[
c: \"[[[[\\\"[[[[\"
d: |
  [[[[
  {{{{
e: >-
    [[[[
f: it's [[[[
g: 'multi
  line [[[['
# [[[[
h: a#[[[[
";
        assert!(depth_ok(text, 0), "{:?}", check(text, 0));
        // In a flow collection, a plain scalar ends at a bracket.
        assert!(!depth_ok("[a[b]]", 1));
    }

    #[test]
    fn a_deep_text_is_refused_in_linear_time() {
        let deep = "[".repeat(4 << 20);
        let t = std::time::Instant::now();
        assert!(!depth_ok(&deep, MAX_FLOW_DEPTH));
        let wide = "[1, ".repeat(1 << 20);
        assert!(!depth_ok(&format!("a: [{wide}]"), MAX_FLOW_DEPTH));
        let flat = "- [1, 2, {a: b}]\n".repeat(200_000);
        assert!(depth_ok(&flat, MAX_FLOW_DEPTH));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }
}
