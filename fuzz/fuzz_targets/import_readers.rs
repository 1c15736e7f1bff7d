//! `tollgate import`'s readers: the nginx.conf grammar (`import::nginx_conf::parse`), the YAML
//! nesting pre-check (`import::ingress::nested_too_deep`) and both converters
//! (`import::nginx::convert`, `import::ingress::convert`), which read the parsed input and
//! render a `gateway.toml`.
//!
//! Input: a selector byte (0 mod 3: nginx.conf, 1: Ingress YAML, 2: Gateway API YAML), then
//! the file's text (at most
//! 64 KiB: an import reads a file whole, and a larger one only repeats what this covers).
//!
//! Properties:
//! - no input panics a reader or a converter, or overflows the stack (nesting is bounded);
//! - what a converter returns loads with the config loader (`Config::parse`): a value the
//!   loader refuses is left out and reported, never printed (issue 50 item 18);
//! - every item of the report names the file it came from.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tollgate::import::{gateway_api, ingress, nginx, nginx_conf};

const MAX_INPUT: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if rest.len() > MAX_INPUT {
        return;
    }
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let files = [("in".to_owned(), text.to_owned())];
    let converted = match selector % 3 {
        0 => {
            let _ = nginx_conf::parse("in", text);
            nginx::convert(&files)
        }
        1 => {
            let _ = ingress::nested_too_deep(text, ingress::MAX_YAML_DEPTH);
            ingress::convert(&files)
        }
        _ => gateway_api::convert(&files),
    };
    if let Ok(import) = converted {
        if let Err(e) = tollgate::config::Config::parse(&import.toml, Path::new(".")) {
            panic!("the import does not load: {e}\n{}", import.toml);
        }
        for item in &import.report.items {
            assert!(item.file == "in" || item.file.is_empty(), "{item}");
        }
    }
});
