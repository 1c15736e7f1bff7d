//! What a store is asked: a [`Limit`] (the part of a limit definition a store decides by), one
//! [`Check`] of it per request, and the [`Op`] to apply.
//!
//! A store never sees how a limit was configured or who asked (the gateway's route, subject
//! rules, headers, metrics): only this. The gateway's own compiled limit dereferences to a
//! [`Limit`] ([`AsLimit`]), so the stores decide its checks without a copy.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::metrics::LeaseMetrics;
use crate::Policy;

/// The first 128 bits of SHA-256 over a subject: what stores key state by, so raw API keys and
/// addresses never sit in memory dumps or Redis key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubjectDigest(pub [u8; 16]);

impl SubjectDigest {
    /// Hashes a subject of a kind (`b'i'` address, `b'h'` header, `b'q'` query, `b'g'` global).
    pub fn of(kind: u8, value: &[u8]) -> SubjectDigest {
        let mut h = Sha256::new();
        h.update([kind]);
        h.update(value);
        let full = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        SubjectDigest(out)
    }

    /// Lower-case hex, 32 characters, appended to `out`.
    pub fn write_hex(&self, out: &mut String) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in self.0 {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }

    /// As a structured-field byte sequence (`:base64:`, RFC 8941 §3.3.5), appended to `out`:
    /// the `pk` (partition key) parameter of the RateLimit fields.
    pub fn write_sf_bytes(&self, out: &mut String) {
        // Every byte is ASCII (the alphabet, `=` and `:`).
        out.push_str(std::str::from_utf8(&self.sf_bytes()).unwrap_or_default());
    }

    /// The same structured-field byte sequence, on the stack.
    pub fn sf_bytes(&self) -> [u8; 26] {
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        // 16 bytes: five whole 3-byte groups and one byte left (`xx==`), between colons.
        let mut buf = [b'='; 26];
        buf[0] = b':';
        buf[25] = b':';
        let mut at = 1;
        for chunk in self.0.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                buf[at + i] = B64[((n >> (18 - 6 * i)) & 63) as usize];
            }
            at += 4;
        }
        buf
    }

    /// Reads [`write_hex`](Self::write_hex)'s 32 digits back; `None` when they are not.
    pub fn from_hex(hex: &[u8]) -> Option<SubjectDigest> {
        if hex.len() != 32 {
            return None;
        }
        let digit = |c: u8| {
            char::from(c)
                .to_digit(16)
                .and_then(|d| u8::try_from(d).ok())
        };
        let mut out = [0u8; 16];
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *o = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(SubjectDigest(out))
    }

    /// The first 8 hex digits: how the admin API names a key subject without revealing it.
    pub fn short_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        self.write_hex(&mut s);
        s.truncate(8);
        s
    }
}

/// One limit as a store decides it: its key, its algorithm's policy, and how it takes part in a
/// request's decision.
#[derive(Debug, Clone)]
pub struct Limit {
    /// The limit's name (the second part of its store key).
    pub name: Arc<str>,
    /// Whose count this is, in store keys: for the gateway a route's name, or a plan's count
    /// (`@<plan>`, `<route>@<plan>`).
    pub scope: Arc<str>,
    pub policy: Policy,
    /// Identifies (scope, limit, algorithm, parameters) in the in-process store and the deny
    /// cache; stable across reloads, so the state of an unchanged limit survives one.
    pub uid: u64,
    /// Decided and reported, never the reason for a denial.
    pub shadow: bool,
    /// Kept in this process whatever the store (the local tier).
    pub local: bool,
    /// Charged after the response: `decide` only evaluates it, unless it [`reserves`](Limit::reserves).
    pub charged_after: bool,
    /// Charged after the response, and reserves `policy.cost` units (or a request's own
    /// amount, [`Op::Reserve`]) when admitted.
    pub reserves: bool,
    /// Leased (`sync = "lease"`): the lease settings and counters.
    pub lease: Option<(LeaseSettings, LeaseMetrics)>,
    /// Has a penalty box (`ban_after`) shared through the store: a shared store's decision
    /// first reads the subject's ban ([`Store::ban`](crate::store::Store::ban)) and refuses a
    /// banned subject ([`DecisionKind::Banned`](crate::DecisionKind)), charging nothing.
    pub bans: bool,
}

/// How a leased limit's leases behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Unused units go back at the latest this long after the lease's last use.
    pub ttl: Duration,
    /// The most units one lease holds.
    pub max: u64,
}

impl Limit {
    /// A limit of `policy` counted under `scope` and `name` (the store key's two parts): enforced,
    /// in the store, charged on admission, not leased. Set the other fields to change that.
    pub fn new(scope: impl Into<Arc<str>>, name: impl Into<Arc<str>>, policy: Policy) -> Limit {
        let (scope, name) = (scope.into(), name.into());
        Limit {
            uid: Limit::uid_of(&scope, &name, &policy),
            name,
            scope,
            policy,
            shadow: false,
            local: false,
            charged_after: false,
            reserves: false,
            lease: None,
            bans: false,
        }
    }

    /// The [`uid`](Limit::uid) of (scope, name, algorithm, parameters): a reload that changes
    /// the parameters starts the limit afresh in process and drops its cached denials, rather
    /// than judging by state kept for other numbers.
    pub fn uid_of(scope: &str, name: &str, policy: &Policy) -> u64 {
        let mut h = Sha256::new();
        h.update(scope.as_bytes());
        h.update([0]);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(format!("{:?}", policy.algorithm).as_bytes());
        for n in [policy.limit, policy.period, policy.burst, policy.cost] {
            h.update(n.to_le_bytes());
        }
        if let Some(c) = policy.calendar {
            h.update(c.as_str().as_bytes());
            // A billing day or an offset other than the defaults (the plain units hash as
            // before: their state survives an upgrade).
            if c.script_code() > 3 {
                h.update(c.script_code().to_le_bytes());
            }
        }
        let d = h.finalize();
        let mut uid = [0u8; 8];
        uid.copy_from_slice(&d[..8]);
        u64::from_le_bytes(uid)
    }

    /// Whether `decide` only evaluates this limit (charged after the response, nothing
    /// reserved): a limit that reserves is charged its reservation when admitted.
    pub fn evaluated_only(&self) -> bool {
        self.charged_after && !self.reserves
    }
}

/// Anything that is a [`Limit`]: the limit itself behind an `Arc`, or a richer definition that
/// dereferences to one (the gateway's compiled limit). Stores take checks of any of them.
pub trait AsLimit: Deref<Target = Limit> + Sync {}

impl<T: Deref<Target = Limit> + Sync + ?Sized> AsLimit for T {}

/// One limit to decide for one request.
#[derive(Debug)]
pub struct Check<'a, L = Arc<Limit>> {
    pub limit: &'a L,
    pub subject: SubjectDigest,
    pub op: Op,
}

// By hand: a check is a reference and two small values, copied whatever the limit type is.
impl<L> Clone for Check<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Check<'_, L> {}

impl<L: AsLimit> Check<'_, L> {
    /// The units this request reserved when admitted, settled after the response: its own
    /// amount (`Op::Reserve`, read from its body), else the limit's fixed `reserve`; `None`
    /// for a limit without one.
    pub fn reserved(&self) -> Option<u64> {
        match self.op {
            _ if !self.limit.reserves => None,
            Op::Reserve(n) => Some(n),
            // A fixed reservation is the policy's cost (the gateway compiles it so), and so is
            // what a request without its body's amount reserves.
            _ => Some(self.limit.policy.cost),
        }
    }

    /// The policy this check is decided under: the limit's, taking a reservation's units as
    /// the request's cost under `Op::Reserve`.
    pub fn decided_policy(&self) -> Policy {
        match self.op {
            Op::Reserve(n) => Policy {
                cost: n,
                ..self.limit.policy
            },
            _ => self.limit.policy,
        }
    }
}

/// What a store does with one [`Check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Op {
    /// `Store::decide`: evaluate, and charge when the request is admitted — except a limit
    /// charged after the response (only evaluated) and a concurrency limit (a slot is taken only
    /// under [`Op::Acquire`]).
    #[default]
    Decide,
    /// `Store::decide` of a concurrency limit: take a slot under this lease id (unique per
    /// request in the whole deployment).
    Acquire(u64),
    /// `Store::decide` of a limit that reserves what the request's body asks
    /// (`reserve = "json:…"`): as `Decide`, with this many units as the request's cost. Never
    /// answered by the deny cache (a denial of one amount says nothing of another).
    Reserve(u64),
    /// `Store::settle`: charge this many units whatever is left, clamped to a spent limit.
    Charge(u64),
    /// `Store::settle`: give back the slot of this lease.
    Release(u64),
    /// `Store::decide` of a limit with `sync = "lease"`: take up to this many units (at least
    /// the limit's cost) in one step; the decision's `delay` carries the units granted (see
    /// [`super::lease`]).
    Lease(u64),
    /// `Store::settle`: give back this many units (a reservation's unused part).
    Return(u64),
    /// `Store::settle`: give back this many unused units of a lease, into the generation of the
    /// state it was granted from (its number, from the grant) and no other: see
    /// `crate::store::Leasing`.
    LeaseReturn(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_are_base64_byte_sequences() {
        let mut s = String::new();
        SubjectDigest([0xfb; 16]).write_sf_bytes(&mut s);
        assert_eq!(s, ":+/v7+/v7+/v7+/v7+/v7+w==:");
        let mut s = String::new();
        SubjectDigest(*b"0123456789abcdef").write_sf_bytes(&mut s);
        assert_eq!(s, ":MDEyMzQ1Njc4OWFiY2RlZg==:");
    }
}
