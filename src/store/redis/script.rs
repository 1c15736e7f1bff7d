//! The decide script's calling convention (see `scripts/decide.lua`): what a queued request
//! carries, how a batch of requests becomes one call's KEYS and ARGV, and how the reply becomes
//! decisions.
//!
//! A batch names each distinct key once and each distinct limit definition once; a request is
//! then two small integers per limit. Requests for the same (limit, subject) in one batch share a
//! key index, which is what lets the script coalesce them (read once, decide in order, write once).

use std::collections::HashMap;

use smallvec::SmallVec;

use super::keys::{algorithm_code, write_key, CALENDAR_WINDOW};
use super::resp::Command;
use crate::limiter::{Check, Decision, Micros, Op};

/// The script's source: the response helpers (charges after the response, concurrency leases),
/// then the decide script that calls them.
pub static SOURCE: &str = concat!(
    include_str!("../scripts/response.lua"),
    include_str!("../scripts/decide.lua")
);

/// The script's SHA-1 in hex (what `EVALSHA` names it by).
pub fn sha1_hex() -> String {
    redis::Script::new(SOURCE).get_hash().to_owned()
}

/// Whether the script charges admitted requests or only evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Charge,
    Evaluate,
    /// Post-response charges and slot releases (`Store::settle`).
    Force,
}

/// One limit's definition, as the script takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Def {
    pub uid: u64,
    pub algorithm: &'static str,
    pub limit: u64,
    pub period: u64,
    pub burst: u64,
    pub cost: u64,
    pub shadow: bool,
    /// Charged after the response: only evaluated when deciding.
    pub after: bool,
}

/// One limit of a queued request: what the script needs, owned (a request may be cancelled while
/// its batch is still queued), without a heap allocation for ordinary keys.
#[derive(Debug, Clone)]
pub struct JobLimit {
    pub def: Def,
    pub subject: [u8; 16],
    pub key: SmallVec<[u8; 120]>,
    /// A concurrency limit's lease id (its sorted-set member); 0 for other limits.
    pub lease: u64,
}

/// A request's limits.
pub type JobLimits = SmallVec<[JobLimit; 2]>;

/// What the script needs of `checks`, keys under `prefix`. A calendar window is computed here,
/// at `now`, and sent as a `cw` definition whose P is the window's end and B its start.
pub fn job_limits(
    prefix: &str,
    checks: &[Check<'_>],
    scratch: &mut Vec<u8>,
    now: Micros,
) -> JobLimits {
    checks
        .iter()
        .map(|c| {
            let p = &c.limit.policy;
            scratch.clear();
            write_key(scratch, prefix, c.limit, &c.subject);
            // A charge's amount is its definition's cost: a definition per (limit, amount).
            let (uid, cost, lease) = match c.op {
                Op::Decide => (c.limit.uid, p.cost, 0),
                Op::Acquire(l) | Op::Release(l) => (c.limit.uid, p.cost, l),
                Op::Charge(units) => {
                    let units = units.min(p.quota());
                    (
                        c.limit.uid ^ units.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(1),
                        units,
                        0,
                    )
                }
            };
            let (algorithm, period, burst) = match p.calendar {
                Some(cal) => {
                    let (start, end) = cal.window(now);
                    (CALENDAR_WINDOW, end, start)
                }
                None => (algorithm_code(p.algorithm), p.period, p.burst),
            };
            JobLimit {
                def: Def {
                    uid,
                    algorithm,
                    limit: p.limit,
                    period,
                    burst,
                    cost,
                    shadow: c.limit.shadow,
                    after: c.limit.after.is_some(),
                },
                subject: c.subject.0,
                key: SmallVec::from_slice(scratch),
                lease,
            }
        })
        .collect()
}

/// Builds one script call's KEYS and ARGV for a batch, reusing its buffers between batches.
#[derive(Debug, Default)]
pub struct Encoder {
    keys: Command,
    defs: Command,
    requests: Command,
    key_index: HashMap<(u64, [u8; 16]), u32>,
    def_index: Vec<u64>,
}

/// A batch's arguments, ready to follow `EVALSHA <sha>` or `EVAL <source>`.
#[derive(Debug, Default)]
pub struct Encoded {
    /// `numkeys`, the keys, then the arguments, as RESP bulk strings.
    pub args: Command,
    /// Limits decided (6 reply integers each).
    pub limits: usize,
}

impl Encoder {
    /// Encodes `requests` (each a request's limits) into `out` (cleared first).
    pub fn encode<'a>(
        &mut self,
        requests: impl Iterator<Item = &'a [JobLimit]> + Clone,
        at: Option<Micros>,
        mode: Mode,
        out: &mut Encoded,
    ) {
        self.keys.clear();
        self.defs.clear();
        self.requests.clear();
        self.key_index.clear();
        self.def_index.clear();
        let mut limits = 0;
        let mut count = 0u64;
        for request in requests {
            count += 1;
            self.requests.int(request.len() as u64);
            for l in request {
                limits += 1;
                let d = match self.def_index.iter().position(|&u| u == l.def.uid) {
                    Some(i) => i + 1,
                    None => {
                        self.def_index.push(l.def.uid);
                        let d = &l.def;
                        self.defs.arg(d.algorithm.as_bytes());
                        self.defs.int(d.limit);
                        self.defs.int(d.period);
                        self.defs.int(d.burst);
                        self.defs.int(d.cost);
                        self.defs.arg(match (d.shadow, d.after) {
                            (false, false) => &b"0"[..],
                            (true, false) => b"1",
                            (false, true) => b"0a",
                            (true, true) => b"1a",
                        });
                        self.def_index.len()
                    }
                };
                let next = u32::try_from(self.key_index.len() + 1).unwrap_or(u32::MAX);
                let k = *self
                    .key_index
                    .entry((l.def.uid, l.subject))
                    .or_insert_with(|| {
                        self.keys.arg(&l.key);
                        next
                    });
                self.requests.int(d as u64);
                self.requests.int(u64::from(k));
                if l.def.algorithm == "cc" {
                    self.requests.int(l.lease);
                }
            }
        }
        let a = &mut out.args;
        a.clear();
        a.int(self.keys.args() as u64);
        a.append(&self.keys);
        match at {
            Some(t) => a.int(t),
            None => a.arg(b""),
        }
        a.arg(match mode {
            Mode::Charge => b"c",
            Mode::Evaluate => b"e",
            Mode::Force => b"f",
        });
        a.int(self.def_index.len() as u64);
        a.append(&self.defs);
        a.int(count);
        a.append(&self.requests);
        out.limits = limits;
    }
}

/// The script's reply integers (6 per limit) as decisions; `None` when one is out of range.
pub fn decisions(ints: &[i64]) -> Option<Vec<Decision>> {
    if ints.len() % 6 != 0 {
        return None;
    }
    let num = |v: i64| u64::try_from(v).ok();
    ints.chunks_exact(6)
        .map(|c| {
            Some(Decision {
                allowed: num(c[0])? == 1,
                limit: num(c[1])?,
                remaining: num(c[2])?,
                retry_after: num(c[3])?,
                reset_after: num(c[4])?,
                delay: num(c[5])?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(uid: u64, subject: u8, key: &str) -> JobLimit {
        JobLimit {
            def: Def {
                uid,
                algorithm: "gcra",
                limit: 10,
                period: 1_000_000,
                burst: 10,
                cost: 1,
                shadow: false,
                after: false,
            },
            subject: [subject; 16],
            key: SmallVec::from_slice(key.as_bytes()),
            lease: 0,
        }
    }

    fn args(c: &Command) -> String {
        let mut out = Vec::new();
        c.write_to(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_batch_names_each_key_and_definition_once() {
        let a = [limit(1, 1, "k1"), limit(2, 1, "k2")];
        let b = [limit(1, 1, "k1")];
        let c = [limit(1, 2, "k3")];
        let requests: [&[JobLimit]; 3] = [&a, &b, &c];
        let mut enc = Encoder::default();
        let mut out = Encoded::default();
        enc.encode(requests.iter().copied(), Some(5), Mode::Charge, &mut out);
        assert_eq!(out.limits, 4);
        let expect: Vec<&str> = vec![
            "3", "k1", "k2", "k3", // numkeys and KEYS
            "5", "c", "2", // time, mode, definitions
            "gcra", "10", "1000000", "10", "1", "0", // definition 1
            "gcra", "10", "1000000", "10", "1", "0", // definition 2
            "3", // requests
            "2", "1", "1", "2", "2", // request 1: (def 1, key 1), (def 2, key 2)
            "1", "1", "1", // request 2: the same key as request 1's first
            "1", "1", "3", // request 3: another subject
        ];
        let mut wire = format!("*{}\r\n", expect.len());
        for e in &expect {
            wire.push_str(&format!("${}\r\n{e}\r\n", e.len()));
        }
        assert_eq!(args(&out.args), wire);
    }

    #[test]
    fn replies_out_of_range_are_refused() {
        assert_eq!(decisions(&[1, 5, 4, 0, 10, 0]).unwrap().len(), 1);
        assert!(decisions(&[1, 5, -4, 0, 10, 0]).is_none());
        assert!(decisions(&[1, 5, 4]).is_none());
    }
}
