//! Who may use the admin endpoints: `[admin] token_file`, the SHA-256 of each admin token.
//!
//! ```text
//! # support team (rotated 2026-11)
//! 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! ```
//!
//! One token hash a line, 64 hex digits as `tollgate key hash` prints them; `#` comments and
//! blank lines are ignored. The file holds hashes so that no token sits on disk (as the
//! consumers file). A request's `Authorization: Bearer TOKEN` is hashed and compared with every
//! hash in constant time ([`subtle`]), all of them whatever matched: how long the check takes
//! says nothing of how close a guess was or which entry matched. The file is read at start-up, by
//! `tollgate check` and on every reload (a rotated token takes effect with a reload).

use std::path::Path;

use subtle::ConstantTimeEq;

use crate::consumers::{hash_key, parse_hex, KeyHash};

/// The admin tokens, by hash.
#[derive(Debug, Default)]
pub struct AdminTokens {
    hashes: Vec<KeyHash>,
}

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read the token file: {0}")]
    Read(#[from] std::io::Error),
    #[error("line {line}: {message}")]
    Invalid { line: usize, message: String },
    #[error("the token file has no token (one SHA-256 hex line per token, as `tollgate key hash` prints it)")]
    Empty,
}

/// The most tokens a file may hold: each request compares with all of them.
pub const MAX_TOKENS: usize = 1024;

impl AdminTokens {
    /// Reads the token file at `path`.
    pub fn load(path: &Path) -> Result<AdminTokens, TokenFileError> {
        AdminTokens::parse(&std::fs::read_to_string(path)?)
    }

    /// Parses the text of a token file.
    pub fn parse(text: &str) -> Result<AdminTokens, TokenFileError> {
        let mut hashes = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |message: String| TokenFileError::Invalid {
                line: i + 1,
                message,
            };
            let Some(h) = parse_hex(line) else {
                return Err(bad(format!(
                    "expected the SHA-256 of a token as 64 hex digits (`tollgate key hash` prints it), got {} characters",
                    line.chars().count()
                )));
            };
            if hashes.contains(&h) {
                return Err(bad("the same token hash appears twice".to_owned()));
            }
            if hashes.len() == MAX_TOKENS {
                return Err(bad(format!("more than {MAX_TOKENS} tokens")));
            }
            hashes.push(h);
        }
        if hashes.is_empty() {
            return Err(TokenFileError::Empty);
        }
        Ok(AdminTokens { hashes })
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Whether `authorization` (the header's value) is `Bearer TOKEN` with a known token.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = authorization.and_then(bearer) else {
            return false;
        };
        let h = hash_key(token);
        // Every entry is compared: no early exit on a match.
        let mut found = subtle::Choice::from(0);
        for known in &self.hashes {
            found |= known.ct_eq(&h);
        }
        found.into()
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case, RFC 9110 §11.1), non-empty.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    #[test]
    fn a_token_is_admitted_by_its_hash() {
        let text = format!(
            "# ops\n\n  {}  \n{}\n",
            hex::encode(&hash_key(b"s3cret")),
            hex::encode(&hash_key(b"other")).to_uppercase()
        );
        let t = AdminTokens::parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t.admits(Some(b"Bearer s3cret")));
        assert!(t.admits(Some(b"bearer other")));
        assert!(t.admits(Some(b"BEARER   s3cret ")));
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer ",
            b"Bearer",
            b"Basic czNjcmV0",
            b"s3cret",
            b"",
        ] {
            assert!(!t.admits(Some(bad)), "{bad:?}");
        }
        assert!(!t.admits(None));
    }

    #[test]
    fn a_malformed_file_names_the_line() {
        let good = hex::encode(&hash_key(b"a"));
        let e = AdminTokens::parse(&format!("# x\n{good}\nnot-a-hash\n")).unwrap_err();
        assert!(e.to_string().starts_with("line 3:"), "{e}");
        let e = AdminTokens::parse(&format!("{good}\n{good}\n")).unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        // The raw token instead of its hash.
        let e = AdminTokens::parse("s3cret\n").unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
        assert!(matches!(
            AdminTokens::parse("# nothing\n\n"),
            Err(TokenFileError::Empty)
        ));
    }
}
