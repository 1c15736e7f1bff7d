//! `Cache-Control` (RFC 9111 §5.2) read into the directives a shared cache acts on, for a
//! request and for a response alike: a pure parser over the field's values, quoted strings
//! and all (`no-cache="Set-Cookie, Foo"` is one directive).

/// The delta-seconds a directive saturates at (RFC 9111 §1.2.2: 2^31).
pub const MAX_DELTA: u64 = 1 << 31;

/// The directives of one `Cache-Control` field (every line of it), request or response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    pub no_store: bool,
    /// `no-cache`, unqualified or with field names (read as unqualified: revalidate always).
    pub no_cache: bool,
    /// `private`, unqualified or with field names (a shared cache stores neither).
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    /// An invalid value reads as `0` (stale: the most restrictive reading).
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    /// `Some(None)`: `max-stale` without a value (any staleness).
    pub max_stale: Option<Option<u64>>,
    pub min_fresh: Option<u64>,
    pub only_if_cached: bool,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
}

impl Directives {
    /// Parses every value of a `Cache-Control` field, in order (a directive given twice:
    /// the first wins, as RFC 9111 §4.2.1 allows).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Directives {
        let mut d = Directives::default();
        for value in values {
            for (name, arg) in split(value) {
                d.set(&name, arg.as_deref());
            }
        }
        d
    }

    /// Whether the field says anything at all (for `Pragma: no-cache`, read only without it).
    pub fn is_empty(&self) -> bool {
        *self == Directives::default()
    }

    fn set(&mut self, name: &str, arg: Option<&str>) {
        let secs = |arg: Option<&str>| Some(arg.map_or(0, delta_seconds));
        match name {
            "no-store" => self.no_store = true,
            "no-cache" => self.no_cache = true,
            "private" => self.private = true,
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "only-if-cached" => self.only_if_cached = true,
            "max-age" if self.max_age.is_none() => self.max_age = secs(arg),
            "s-maxage" if self.s_maxage.is_none() => self.s_maxage = secs(arg),
            "min-fresh" if self.min_fresh.is_none() => self.min_fresh = secs(arg),
            "max-stale" if self.max_stale.is_none() => {
                self.max_stale = Some(arg.map(delta_seconds));
            }
            "stale-while-revalidate" if self.stale_while_revalidate.is_none() => {
                self.stale_while_revalidate = arg.map(delta_seconds);
            }
            "stale-if-error" if self.stale_if_error.is_none() => {
                self.stale_if_error = arg.map(delta_seconds);
            }
            _ => {}
        }
    }
}

/// A delta-seconds value: its leading digits (`3600a`, `3600.5`: 3600, as most caches read
/// them), saturated at [`MAX_DELTA`]; without a leading digit it is `0` (stale).
pub fn delta_seconds(s: &str) -> u64 {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return 0;
    }
    s[..digits]
        .parse::<u64>()
        .map_or(MAX_DELTA, |n| n.min(MAX_DELTA))
}

/// The directives of one field line: lower-case names, arguments unquoted.
fn split(value: &[u8]) -> Vec<(String, Option<String>)> {
    let text = String::from_utf8_lossy(value);
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        // The name, up to '=' or ','.
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            name.push(c);
            chars.next();
        }
        let mut arg = None;
        if chars.peek() == Some(&'=') {
            chars.next();
            // No space around '=' (RFC 9111 §5.2: `token [ "=" ( token / quoted-string ) ]`):
            // a space before it makes the directive unknown, one after it the value invalid.
            if name.ends_with([' ', '\t']) {
                name.clear();
            }
            let mut a = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                a.push(n);
                            }
                        }
                        c => a.push(c),
                    }
                }
                // Anything up to the next ',' is not the directive's.
                while chars.peek().is_some_and(|c| *c != ',') {
                    chars.next();
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    a.push(c);
                    chars.next();
                }
            }
            arg = Some(a.trim_end().to_owned());
        }
        let name = name.trim().to_ascii_lowercase();
        if !name.is_empty() {
            out.push((name, arg));
        }
        if chars.next().is_none() {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(v: &str) -> Directives {
        Directives::parse([v.as_bytes()])
    }

    #[test]
    fn directives_are_read_as_rfc_9111_writes_them() {
        let d = cc("public, max-age=60, s-maxage=\"120\", must-revalidate");
        assert!(d.public && d.must_revalidate);
        assert_eq!((d.max_age, d.s_maxage), (Some(60), Some(120)));
        // A quoted list is one directive.
        let d = cc("no-cache=\"Set-Cookie, max-age=10\", private");
        assert!(d.no_cache && d.private);
        assert_eq!(d.max_age, None);
        // The first of two wins; an invalid value is stale; big values saturate.
        assert_eq!(cc("max-age=5, max-age=50").max_age, Some(5));
        assert_eq!(cc("max-age=abc").max_age, Some(0));
        assert_eq!(cc("max-age=a100").max_age, Some(0));
        assert_eq!(cc("max-age=3600a").max_age, Some(3600));
        assert_eq!(cc("max-age=3600.5").max_age, Some(3600));
        assert_eq!(cc("max-age=99999999999999999999").max_age, Some(MAX_DELTA));
        // Case-insensitive names; request directives.
        let d = cc("MAX-STALE, Min-Fresh=3, only-if-cached, No-Store");
        assert_eq!(d.max_stale, Some(None));
        assert_eq!(d.min_fresh, Some(3));
        assert!(d.only_if_cached && d.no_store);
        assert_eq!(cc("max-stale=7").max_stale, Some(Some(7)));
        let d = cc("stale-while-revalidate=30, stale-if-error=600");
        assert_eq!(
            (d.stale_while_revalidate, d.stale_if_error),
            (Some(30), Some(600))
        );
        assert!(cc("").is_empty() && cc(" , ,").is_empty());
        // Spaces around '=': an unknown directive, or an invalid value.
        assert_eq!(cc("max-age =60").max_age, None);
        assert_eq!(cc("max-age= 60").max_age, Some(0));
    }
}
