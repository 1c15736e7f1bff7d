//! The decide script's calling convention (see `scripts/decide.lua`): what a queued request
//! carries, how a batch of requests becomes one call's KEYS and ARGV, and how the reply becomes
//! decisions.
//!
//! A batch names each distinct key once and each distinct limit definition once; a request is
//! then two small integers per limit. Requests for the same (limit, subject) in one batch share a
//! key index, which is what lets the script coalesce them (read once, decide in order, write once).

use crate::calendar::CalendarWindow;
use std::collections::HashMap;

use smallvec::SmallVec;

use super::keys::{write_key, ScriptAlgorithm};
use super::replay::ReplayLimit;
use super::resp::Command;
use crate::Algorithm;
use crate::{AsLimit, Check, Decision, Micros, Op, Policy};

/// The library's body, in order: the state encoding and the clock, one table per algorithm,
/// then the modes (runs, decide and settle, support's corrections) and `main`, which picks one.
macro_rules! library_body {
    () => {
        concat!(
            include_str!("../scripts/state.lua"),
            include_str!("../scripts/algorithms.lua"),
            include_str!("../scripts/runs.lua"),
            include_str!("../scripts/decide.lua"),
            include_str!("../scripts/quota.lua"),
            include_str!("../scripts/main.lua")
        )
    };
}

/// The library as an `EVAL` script (`return main(KEYS, ARGV)`): where functions are not
/// available (Redis before 7.0, or an ACL without `FCALL`/`FUNCTION`), and for the rare calls
/// of support's corrections. Lua builds every table and function of it again on each call.
pub static SOURCE: &str = concat!(library_body!(), "\nreturn main(KEYS, ARGV)\n");

/// The script's SHA-1 in hex (what `EVALSHA` names it by).
pub fn sha1_hex() -> String {
    redis::Script::new(SOURCE).get_hash().to_owned()
}

/// The library as Redis functions load it (`FUNCTION LOAD`): its tables and functions are built
/// once, when it is loaded, and every `FCALL` runs `main` on them. Named after the source's
/// hash, so that gateways of different versions sharing a Redis each call their own.
#[derive(Debug)]
pub struct Library {
    /// The library's name, which is also its one function's (`FCALL <name>`).
    pub name: String,
    /// `FUNCTION LOAD`'s argument: the shebang line naming the library, the body, and the
    /// registration of `main`.
    pub source: String,
}

/// The library (built once per process).
pub fn library() -> &'static Library {
    static LIBRARY: std::sync::OnceLock<Library> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(|| {
        let sha = sha1_hex();
        let name = format!("tollgate_{}", sha.get(..16).unwrap_or(&sha));
        let source = format!(
            "#!lua name={name}\n{}\nredis.register_function('{name}', main)\n",
            library_body!()
        );
        Library { name, source }
    })
}

/// What a failed call's error says of the library: Redis does not have it (never loaded, or
/// `FUNCTION FLUSH`, or a Redis restarted without persistence), or cannot run functions at all
/// (before 7.0, or an ACL refusing `FCALL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Load it (`FUNCTION LOAD`) and call it again.
    Library,
    /// Use `EVALSHA` (and `EVAL` after `NOSCRIPT`) instead.
    Functions,
}

impl Missing {
    /// Reads an error reply to `FCALL`.
    pub fn of(error: &str) -> Option<Missing> {
        if error.starts_with("ERR Function not found") {
            Some(Missing::Library)
        } else if error.starts_with("ERR unknown command")
            || (error.starts_with("NOPERM") && error.contains("fcall"))
        {
            Some(Missing::Functions)
        } else {
            None
        }
    }
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
    pub algorithm: ScriptAlgorithm,
    pub limit: u64,
    pub period: u64,
    pub burst: u64,
    pub cost: u64,
    pub shadow: bool,
    /// Charged after the response: only evaluated when deciding.
    pub after: bool,
    /// A lease: take up to this many units (`sync = "lease"`, `Op::Lease`); 0 for none.
    pub lease: u64,
    /// Gives `cost` units back (`Op::Return`, `Op::LeaseReturn`, settle mode).
    pub give_back: bool,
    /// A lease's units given back: the generation of the state they were granted from (0: a
    /// reservation's units, no generation).
    pub generation: u64,
    /// Has a penalty box shared through the store: the decision reads the subject's ban
    /// (flag `b`, decide.lua).
    pub ban: bool,
}

impl Def {
    /// The policy the gateway replays a batch with (see [`Encoder::encode_runs`]); `None` for
    /// the algorithms that are not sent as runs: the sliding log (its state is a list), a
    /// concurrency limit (each request its own lease) and a calendar window (computed here).
    pub fn replay_policy(&self) -> Option<Policy> {
        if self.lease > 0 || self.give_back || self.ban {
            // A lease's cost is what it gets; a ban is read by decide.lua: decided by the
            // script alone.
            return None;
        }
        let algorithm = match self.algorithm {
            ScriptAlgorithm::FixedWindow => Algorithm::FixedWindow,
            ScriptAlgorithm::SlidingWindow => Algorithm::SlidingWindow,
            ScriptAlgorithm::TokenBucket => Algorithm::TokenBucket,
            ScriptAlgorithm::Gcra => Algorithm::Gcra,
            ScriptAlgorithm::LeakyBucket => Algorithm::LeakyBucket,
            ScriptAlgorithm::CalendarWindow
            | ScriptAlgorithm::SlidingLog
            | ScriptAlgorithm::Concurrency => return None,
        };
        Some(Policy {
            algorithm,
            limit: self.limit,
            period: self.period,
            burst: self.burst,
            cost: self.cost,
            calendar: None,
        })
    }
}

/// One limit of a queued request: what the script needs, owned (a request may be cancelled while
/// its batch is still queued), without a heap allocation for ordinary keys.
#[derive(Debug, Clone)]
pub struct JobLimit {
    pub def: Def,
    /// The limit's uid: with `subject`, which key this is. Not `def.uid`, which differs per
    /// charged amount (a definition per amount), while every amount charges the one key.
    pub limit_uid: u64,
    pub subject: [u8; 16],
    pub key: SmallVec<[u8; 120]>,
    /// A concurrency limit's lease id (its sorted-set member); 0 for other limits.
    pub lease: u64,
}

/// A request's limits.
pub type JobLimits = SmallVec<[JobLimit; 2]>;

/// A calendar window as a `cw` definition's P (state.lua's `cal_window`).
fn calendar_code(cal: CalendarWindow) -> u64 {
    cal.script_code()
}

/// What the script needs of `checks`, keys under `prefix`. A calendar limit is sent as a `cw`
/// definition whose P is its unit: the script computes the window at its own `now` (Redis
/// `TIME`, or the injected time), the one clock of the whole decision.
pub fn job_limits<L: AsLimit>(
    prefix: &str,
    checks: &[Check<'_, L>],
    scratch: &mut Vec<u8>,
) -> JobLimits {
    checks
        .iter()
        .map(|c| {
            let p = &c.limit.policy;
            scratch.clear();
            write_key(scratch, prefix, c.limit, &c.subject);
            // A charge's amount is its definition's cost: a definition per (limit, amount).
            let mix = |n: u64, salt: u64| {
                c.limit.uid ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(1) ^ salt
            };
            let (uid, cost, lease) = match c.op {
                Op::Decide => (c.limit.uid, p.cost, 0),
                // A definition per reserved amount (the limit's own key).
                Op::Reserve(n) => (mix(n, 0x7e5e), n, 0),
                Op::Acquire(l) | Op::Release(l) => (c.limit.uid, p.cost, l),
                // A definition per asked amount, and per amount given back.
                Op::Lease(n) => (mix(n, 0x1ea5e), p.cost, 0),
                Op::Return(units) => (mix(units, 0x2e7), units.min(p.quota()), 0),
                Op::LeaseReturn(units, g) => (
                    mix(units, 0x2e7) ^ g.wrapping_mul(0xff51_afd7_ed55_8ccd),
                    units.min(p.quota()),
                    0,
                ),
                Op::Charge(units) => {
                    let units = units.min(p.quota());
                    (
                        c.limit.uid ^ units.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(1),
                        units,
                        0,
                    )
                }
            };
            // A calendar window is the script's to compute, on Redis TIME (see decide.lua).
            let algorithm = ScriptAlgorithm::of(p);
            let (period, burst) = match p.calendar {
                Some(cal) => (calendar_code(cal), 0),
                None => (p.period, p.burst),
            };
            JobLimit {
                limit_uid: c.limit.uid,
                def: Def {
                    uid,
                    algorithm,
                    limit: p.limit,
                    period,
                    burst,
                    cost,
                    shadow: c.limit.shadow,
                    after: c.limit.evaluated_only(),
                    lease: match c.op {
                        Op::Lease(n) => n.max(1),
                        _ => 0,
                    },
                    give_back: matches!(c.op, Op::Return(_) | Op::LeaseReturn(..)),
                    generation: match c.op {
                        Op::LeaseReturn(_, g) => g,
                        _ => 0,
                    },
                    ban: c.limit.bans,
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
    /// Mode `r`'s runs, one argument of two-character numbers (see [`RUN_DIGITS`]).
    runs: Vec<u8>,
    /// foldhash (seeded): SipHash of each key was ≈ 300 instructions a request (BENCHMARKS.md,
    /// stop 52).
    key_index: HashMap<(u64, [u8; 16]), u32, foldhash::fast::RandomState>,
    def_index: Vec<u64>,
    /// The call's deadline on Redis's clock (µs), sent with its leases (`d<T>`): a lease the
    /// script runs later is granted nothing. Set by the caller before each encode.
    pub deadline: Option<u64>,
}

/// A batch's arguments, ready to follow `EVALSHA <sha>` or `EVAL <source>`.
#[derive(Debug, Default)]
pub struct Encoded {
    /// `numkeys`, the keys, then the arguments, as RESP bulk strings.
    pub args: Command,
    /// Limits decided (6 reply integers each in mode `c`).
    pub limits: usize,
    /// Sent as runs (mode `r`): every limit in batch order, to replay the reply with; empty
    /// otherwise.
    pub replay: Vec<ReplayLimit>,
    /// Distinct keys (mode `r`'s reply has 4 integers per key after `now`).
    pub keys: usize,
}

/// A request's limits at most, for a batch sent as runs (a run's header is `count·16 + n`).
pub(super) const MAX_RUN_LIMITS: usize = 15;

/// Mode `r`'s numbers (a run's header, definition and key indexes) are sent in one argument,
/// each as two characters `'0' + x % 64`, `'0' + x / 64`: the script reads them with one
/// `string.byte` instead of one argument and one `strtod` each (the numbers were ≈ 10 % of
/// the script's work on a batch of distinct keys). Printable, so `MONITOR` and a shell can
/// show and send it. A batch whose numbers do not fit goes in mode `c`.
const RUN_DIGITS: u64 = 64 * 64;

impl Encoder {
    /// Encodes `requests` (each a request's limits) into `out` (cleared first).
    pub fn encode<'a>(
        &mut self,
        requests: impl Iterator<Item = &'a [JobLimit]> + Clone,
        at: Option<Micros>,
        mode: Mode,
        out: &mut Encoded,
    ) {
        self.clear();
        out.replay.clear();
        let mut limits = 0;
        let mut count = 0u64;
        for request in requests {
            count += 1;
            self.requests.int(request.len() as u64);
            for l in request {
                limits += 1;
                let d = self.def_of(l);
                let k = self.key_of(l);
                self.requests.int(d as u64);
                self.requests.int(u64::from(k));
                if l.def.algorithm == ScriptAlgorithm::Concurrency {
                    self.requests.int(l.lease);
                }
            }
        }
        let mode = match mode {
            Mode::Charge => b"c",
            Mode::Evaluate => b"e",
            Mode::Force => b"f",
        };
        self.finish(at, mode, count, out);
        out.limits = limits;
    }

    /// Encodes a batch of decisions as runs of identical requests (mode `r`): consecutive
    /// requests with the same limits on the same keys are sent once with their count, and the
    /// script replies with the keys' states, which [`super::replay::replay`] turns into the
    /// decisions. `false` (nothing usable in `out`) when the batch cannot be sent so: a limit
    /// whose algorithm has no [`Def::replay_policy`], a request naming one key twice, or more
    /// than [`MAX_RUN_LIMITS`] limits in a request; `encode` then sends it in mode `c`.
    pub fn encode_runs<'a>(
        &mut self,
        requests: impl Iterator<Item = &'a [JobLimit]> + Clone,
        at: Option<Micros>,
        out: &mut Encoded,
    ) -> bool {
        let eligible = requests.clone().all(|r| {
            !r.is_empty()
                && r.len() <= MAX_RUN_LIMITS
                && r.iter().all(|l| l.def.replay_policy().is_some())
        });
        if !eligible {
            return false;
        }
        self.clear();
        out.replay.clear();
        let mut run: SmallVec<[(u32, u32); 4]> = SmallVec::new();
        let mut this: SmallVec<[(u32, u32); 4]> = SmallVec::new();
        let mut count = 0u64;
        for request in requests {
            this.clear();
            for l in request {
                let d = u32::try_from(self.def_of(l)).unwrap_or(u32::MAX);
                let k = self.key_of(l);
                if this.iter().any(|&(_, other)| other == k) {
                    return false;
                }
                this.push((d, k));
                let Some(policy) = l.def.replay_policy() else {
                    return false;
                };
                out.replay.push(ReplayLimit {
                    key: k - 1,
                    policy,
                    shadow: l.def.shadow,
                    after: l.def.after,
                });
            }
            if count > 0 && this == run {
                count += 1;
            } else {
                if count > 0 && !self.push_run(count, &run) {
                    return false;
                }
                std::mem::swap(&mut run, &mut this);
                count = 1;
            }
        }
        if count > 0 && !self.push_run(count, &run) {
            return false;
        }
        self.finish_runs(at, out);
        out.limits = out.replay.len();
        out.keys = self.key_index.len();
        true
    }

    /// Appends a run (`count` requests with these limits) to the runs argument; `false` when a
    /// number does not fit in [`RUN_DIGITS`].
    fn push_run(&mut self, count: u64, limits: &[(u32, u32)]) -> bool {
        let header = count.saturating_mul(16).saturating_add(limits.len() as u64);
        let mut ok = self.run_number(header);
        for &(d, k) in limits {
            ok &= self.run_number(u64::from(d));
            ok &= self.run_number(u64::from(k));
        }
        ok
    }

    fn run_number(&mut self, x: u64) -> bool {
        if x >= RUN_DIGITS {
            return false;
        }
        // Both below 64: the casts keep every bit.
        self.runs.push(b'0' + (x % 64) as u8);
        self.runs.push(b'0' + (x / 64) as u8);
        true
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.defs.clear();
        self.requests.clear();
        self.runs.clear();
        self.key_index.clear();
        self.def_index.clear();
    }

    /// The 1-based index of `l`'s definition, added at its first use.
    fn def_of(&mut self, l: &JobLimit) -> usize {
        if let Some(i) = self.def_index.iter().position(|&u| u == l.def.uid) {
            return i + 1;
        }
        self.def_index.push(l.def.uid);
        let d = &l.def;
        self.defs.arg(d.algorithm.code().as_bytes());
        self.defs.int(d.limit);
        self.defs.int(d.period);
        self.defs.int(d.burst);
        self.defs.int(d.cost);
        let flags = match (d.shadow, d.after) {
            (false, false) => &b"0"[..],
            (true, false) => b"1",
            (false, true) => b"0a",
            (true, true) => b"1a",
        };
        let ban = |f: &mut Vec<u8>| {
            if d.ban {
                f.push(b'b');
            }
        };
        if d.lease > 0 {
            // `l<N>`: a lease of up to N units (decide.lua).
            let mut f = flags.to_vec();
            f.push(b'l');
            f.extend_from_slice(itoa::Buffer::new().format(d.lease).as_bytes());
            if let Some(t) = self.deadline {
                // `d<T>`: not granted once Redis TIME reaches T (the gateway gave up).
                f.push(b'd');
                f.extend_from_slice(itoa::Buffer::new().format(t).as_bytes());
            }
            ban(&mut f);
            self.defs.arg(&f);
        } else if d.give_back {
            let mut f = flags.to_vec();
            f.push(b'r');
            if d.generation > 0 {
                f.extend_from_slice(itoa::Buffer::new().format(d.generation).as_bytes());
            }
            ban(&mut f);
            self.defs.arg(&f);
        } else if d.ban {
            let mut f = flags.to_vec();
            ban(&mut f);
            self.defs.arg(&f);
        } else {
            self.defs.arg(flags);
        }
        self.def_index.len()
    }

    /// The 1-based index of `l`'s key in KEYS, added at its first use: one index per key,
    /// whatever amounts charge it (the script reads and writes each index once: a key named
    /// twice would be written twice, the last write losing the other's charges).
    fn key_of(&mut self, l: &JobLimit) -> u32 {
        let next = u32::try_from(self.key_index.len() + 1).unwrap_or(u32::MAX);
        *self
            .key_index
            .entry((l.limit_uid, l.subject))
            .or_insert_with(|| {
                self.keys.arg(&l.key);
                next
            })
    }

    /// Writes the call's arguments: KEYS, time, mode, definitions, then `count` and the
    /// requests.
    fn finish(&self, at: Option<Micros>, mode: &[u8], count: u64, out: &mut Encoded) {
        self.head(at, mode, out);
        out.args.int(count);
        out.args.append(&self.requests);
    }

    /// Mode `r`'s arguments: KEYS, time, `r`, definitions, then the runs in one argument.
    fn finish_runs(&self, at: Option<Micros>, out: &mut Encoded) {
        self.head(at, b"r", out);
        out.args.arg(&self.runs);
    }

    fn head(&self, at: Option<Micros>, mode: &[u8], out: &mut Encoded) {
        let a = &mut out.args;
        a.clear();
        a.int(self.keys.args() as u64);
        a.append(&self.keys);
        match at {
            Some(t) => a.int(t),
            None => a.arg(b""),
        }
        a.arg(mode);
        a.int(self.def_index.len() as u64);
        a.append(&self.defs);
    }
}

/// The script's reply integers (6 per limit) as decisions; `None` when one is out of range. A
/// delay of -1 marks a limit refused by a ban (decide.lua's flag `b`).
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
                delay: if c[5] == -1 { 0 } else { num(c[5])? },
                kind: if c[5] == -1 {
                    crate::DecisionKind::Banned
                } else {
                    crate::DecisionKind::Decided
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(uid: u64, subject: u8, key: &str) -> JobLimit {
        JobLimit {
            limit_uid: uid,
            def: Def {
                uid,
                algorithm: ScriptAlgorithm::Gcra,
                limit: 10,
                period: 1_000_000,
                burst: 10,
                cost: 1,
                shadow: false,
                after: false,
                lease: 0,
                give_back: false,
                generation: 0,
                ban: false,
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
    fn runs_go_in_one_argument_of_two_character_numbers() {
        let a = [limit(1, 1, "k1"), limit(2, 1, "k2")];
        let b = [limit(1, 2, "k3")];
        // Three identical requests (one run of 3), then another subject's (a run of 1).
        let requests: [&[JobLimit]; 4] = [&a, &a, &a, &b];
        let mut enc = Encoder::default();
        let mut out = Encoded::default();
        assert!(enc.encode_runs(requests.iter().copied(), None, &mut out));
        assert_eq!((out.limits, out.keys), (7, 3));
        // 3·16 + 2 = 50 → "b0"; (1, 1) (2, 2); 1·16 + 1 = 17 → "A0"; (1, 3).
        let runs = "b010102020A01030";
        let expect: Vec<&str> = vec![
            "3", "k1", "k2", "k3", "", "r", "2", // KEYS, time (Redis TIME), mode, definitions
            "gcra", "10", "1000000", "10", "1", "0", //
            "gcra", "10", "1000000", "10", "1", "0", //
            runs,
        ];
        let mut wire = format!("*{}\r\n", expect.len());
        for e in &expect {
            wire.push_str(&format!("${}\r\n{e}\r\n", e.len()));
        }
        assert_eq!(args(&out.args), wire);
        // A number of 64·64 or more does not fit: the batch goes in mode `c`.
        let many: Vec<&[JobLimit]> = std::iter::repeat_n(&b[..], 256).collect();
        assert!(!enc.encode_runs(many.iter().copied(), None, &mut out));
    }

    #[test]
    fn replies_out_of_range_are_refused() {
        assert_eq!(decisions(&[1, 5, 4, 0, 10, 0]).unwrap().len(), 1);
        assert!(decisions(&[1, 5, -4, 0, 10, 0]).is_none());
        assert!(decisions(&[1, 5, 4]).is_none());
    }
}
