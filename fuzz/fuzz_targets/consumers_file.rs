//! The consumers file reader (`consumers::ConsumerTable::parse`): a fast line scanner for files
//! in the plain shape a script writes, and the full TOML parser for everything else.
//!
//! Input: the file's text.
//!
//! Properties:
//! - no file panics it;
//! - the scanner reads exactly what TOML reads: the file gives the same table (the same
//!   consumers, keys, certificates and plans), or the same error on the same line, as it does through the TOML
//!   parser alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::consumers::{ConsumerTable, ConsumersFileError};

const PLANS: [&str; 3] = ["free", "gold", "p"];

/// A table as comparable data: (key or certificate, hash, name, plan), sorted.
fn rows(t: &ConsumerTable) -> Vec<(char, [u8; 32], String, usize)> {
    let mut rows: Vec<_> = t
        .iter_keyed()
        .map(|(k, c)| ('k', *k, c.name.to_string(), c.plan))
        .chain(
            t.iter_certs()
                .map(|(k, c)| ('c', *k, c.name.to_string(), c.plan)),
        )
        .collect();
    rows.sort();
    rows
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fast = ConsumerTable::parse(text, &PLANS);
    let toml = ConsumerTable::parse_with_toml(text, &PLANS);
    match (&fast, &toml) {
        (Ok(a), Ok(b)) => assert_eq!(rows(a), rows(b), "{text:?}"),
        (
            Err(ConsumersFileError::Invalid { line, message }),
            Err(ConsumersFileError::Invalid {
                line: line2,
                message: message2,
            }),
        ) => assert_eq!((line, message), (line2, message2), "{text:?}"),
        (Err(ConsumersFileError::Parse(_)), Err(ConsumersFileError::Parse(_))) => {}
        _ => panic!("{text:?}: the scanner read {fast:?}, TOML {toml:?}"),
    }
});
