//! The batch rule, one pure function for every store: how one request's limits, each decided on
//! its own ([`super::evaluate`]), become the request's fate and who pays for it.
//!
//! A request is admitted when every limit admits it, shadow limits apart (they are decided and
//! reported, never the reason for a denial); a denied request charges nothing. An admitted
//! request charges the limits that admitted it and are charged on admission: not a shadow limit
//! that would have denied it, not a limit charged after the response (evaluated only). The
//! in-process store applies it under its shards' locks, the Redis store's replay to the states
//! the script read, and `decide.lua` is the same rule in Lua (the differential tests hold the
//! three to one another).

/// One limit's part in a request's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The limit admitted the request.
    pub allowed: bool,
    /// A shadow limit: decided and reported, never the reason for a denial.
    pub shadow: bool,
    /// Charged on admission (not only evaluated: e.g. charged after the response).
    pub charged_on_admission: bool,
}

/// Whether the request whose limits decided `parts` is admitted.
pub fn admitted(parts: impl IntoIterator<Item = Part>) -> bool {
    parts.into_iter().all(|p| p.allowed || p.shadow)
}

impl Part {
    /// Whether an admitted request charges this limit.
    pub fn charged(self) -> bool {
        self.allowed && self.charged_on_admission
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(allowed: bool, shadow: bool, charged_on_admission: bool) -> Part {
        Part {
            allowed,
            shadow,
            charged_on_admission,
        }
    }

    #[test]
    fn a_request_is_admitted_when_every_enforcing_limit_admits_it() {
        assert!(admitted([part(true, false, true), part(true, false, true)]));
        assert!(!admitted([
            part(true, false, true),
            part(false, false, true)
        ]));
        // A shadow limit that denies does not deny the request, and is not charged.
        let shadow = part(false, true, true);
        assert!(admitted([part(true, false, true), shadow]));
        assert!(!shadow.charged());
        // A limit charged after the response admits without being charged here.
        let after = part(true, false, false);
        assert!(admitted([after]) && !after.charged());
        assert!(admitted(std::iter::empty()));
    }
}
