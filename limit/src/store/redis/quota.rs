//! Support's corrections on Redis: `scripts/quota.lua`, one atomic script call per correction
//! (see [`crate::adjust`] for what reset and grant do), sent to the decide library
//! as an `EVAL` script.
//!
//! Corrections are rare (an operator's request): on one Redis each opens its own connection
//! rather than queueing in a worker's lane, whose batches are the hot path's; on a Cluster it
//! uses the cluster connection, routed by the key's slot.

use super::conn::Target;
use super::keys::{key, ScriptAlgorithm};
use super::resp::{Command, Reply};
use crate::adjust::Adjust;
use crate::calendar::CalendarWindow;
use crate::store::{StoreError, StoreErrorKind};
use crate::{AsLimit, Check};

/// The script: the library as an `EVAL` script, whose `main` sends these calls to quota.lua.
pub use super::script::SOURCE;

/// A calendar window as quota.lua's P (state.lua's `cal_window` code).
fn calendar_code(cal: CalendarWindow) -> u64 {
    cal.script_code()
}

/// `EVAL`'s arguments after the script: the key count, the key, then ARGV (see quota.lua).
pub fn args<L: AsLimit>(
    prefix: &str,
    check: &Check<'_, L>,
    adjust: Adjust,
    now: Option<u64>,
) -> Vec<Vec<u8>> {
    let p = &check.limit.policy;
    let alg = ScriptAlgorithm::of(p).code();
    let (period, burst) = match p.calendar {
        Some(c) => (calendar_code(c), 0),
        None => (p.period, p.burst),
    };
    let (mode, units) = match adjust {
        Adjust::Reset => ("reset", 0),
        Adjust::Grant(u) => ("grant", u),
    };
    vec![
        b"1".to_vec(),
        key(prefix, check.limit, &check.subject).into_bytes(),
        now.map(|n| n.to_string()).unwrap_or_default().into_bytes(),
        mode.as_bytes().to_vec(),
        alg.as_bytes().to_vec(),
        p.limit.to_string().into_bytes(),
        period.to_string().into_bytes(),
        burst.to_string().into_bytes(),
        units.to_string().into_bytes(),
    ]
}

/// Runs the script on one Redis over a connection of its own.
pub async fn run_single(target: &Target, args: &[Vec<u8>]) -> Result<(), StoreError> {
    let mut cmd = Command::default();
    cmd.arg(b"EVAL");
    cmd.arg(SOURCE.as_bytes());
    for a in args {
        cmd.arg(a);
    }
    match target.call_once(&cmd).await? {
        Reply::Int(_) => Ok(()),
        Reply::Error(e) => Err(StoreError::new(
            StoreErrorKind::Server,
            format!("quota script: {e}"),
        )),
        _ => Err(StoreError::new(
            StoreErrorKind::Other,
            "malformed reply from the quota script",
        )),
    }
}

/// The shared penalty box's keys (quota.lua's `ban` modes): a subject's ban, `<state key>:b`
/// (its state's hash tag, so its Cluster slot: decide.lua reads it in the decision), and a
/// limit's index of bans, `<prefix>:{<scope>:<limit>}:bans` (read only when bans are lifted).
pub fn ban_key<L: AsLimit>(prefix: &str, check: &Check<'_, L>) -> String {
    let mut k = key(prefix, check.limit, &check.subject);
    k.push_str(":b");
    k
}

/// A limit's index of bans (see [`ban_key`]).
pub fn index_key(prefix: &str, limit: &crate::Limit) -> String {
    format!("{prefix}:{{{}:{}}}:bans", limit.scope, limit.name)
}

/// `EVAL`'s arguments after the script for a `ban` mode on `key` (see quota.lua).
pub fn ban_args(key: String, mode: &str, rest: &[&str]) -> Vec<Vec<u8>> {
    let mut a = vec![
        b"1".to_vec(),
        key.into_bytes(),
        Vec::new(),
        mode.as_bytes().to_vec(),
    ];
    a.extend(rest.iter().map(|r| r.as_bytes().to_vec()));
    a
}

/// Runs the script on one Redis over a connection of its own: its reply, an integer or a string.
pub async fn run_single_reply(target: &Target, args: &[Vec<u8>]) -> Result<Reply, StoreError> {
    let mut cmd = Command::default();
    cmd.arg(b"EVAL");
    cmd.arg(SOURCE.as_bytes());
    for a in args {
        cmd.arg(a);
    }
    match target.call_once(&cmd).await? {
        Reply::Error(e) => Err(StoreError::new(
            StoreErrorKind::Server,
            format!("bans script: {e}"),
        )),
        r @ (Reply::Int(_) | Reply::Text(_) | Reply::Nil) => Ok(r),
        Reply::Ints(_) => Err(StoreError::new(
            StoreErrorKind::Other,
            "malformed reply from the bans script",
        )),
    }
}
