//! The query parameters of an admin request.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

/// One `name=value` pair of a query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param<'q> {
    /// Percent-decoded.
    pub name: String,
    /// Percent-decoded (`+` stays `+`: API keys are often base64).
    pub value: Vec<u8>,
    /// As written, still percent-encoded.
    pub raw_value: &'q str,
}

/// The pairs of `query`, in order; an error names a name that is not UTF-8.
pub fn params(query: Option<&str>) -> Result<Vec<Param<'_>>, String> {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode_str(name)
                .decode_utf8()
                .map_err(|_| format!("parameter name {name:?} is not UTF-8"))?;
            let value: Cow<'_, [u8]> = percent_decode_str(raw_value).into();
            Ok(Param {
                name: name.into_owned(),
                value: value.into_owned(),
                raw_value,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_decoded() {
        let p = params(Some("route=a%20b&header.X-Api-Key=k+1%2F&&flag")).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].name, "route");
        assert_eq!(p[0].value, b"a b");
        assert_eq!(p[1].name, "header.X-Api-Key");
        assert_eq!(p[1].value, b"k+1/");
        assert_eq!(p[1].raw_value, "k+1%2F");
        assert_eq!(p[2].name, "flag");
        assert!(p[2].value.is_empty());
        assert!(params(None).unwrap().is_empty());
        assert!(params(Some("%ff=1")).is_err());
    }
}
