//! A gateway on a time the test sets (the `test-clock` cargo feature only; compiled out of a
//! production build, which has neither the variable nor the endpoint).
//!
//! Integration tests start the real binary; to make window ends, refills, `Retry-After`,
//! reset headers, calendar windows and the deny cache exact and free of sleeps, a test starts it
//! with `TOLLGATE_TEST_CLOCK=<µs since the Unix epoch>`: the gateway then builds its store (and
//! every store a reload builds) on a [`ManualClock`] standing there, and the admin listener
//! answers `POST /-/test/clock?advance=<µs>` and `POST /-/test/clock?set=<µs>` by moving it
//! (reply: `{"now":µs}`). The Redis stores pass that time to their scripts instead of reading
//! Redis `TIME` (the path [`ManualClock`] always took in the store tests), and the deny cache
//! ages on it. Without the variable a `test-clock` binary runs on the system clock, as in
//! production, and the endpoint answers 409.
//!
//! An admin endpoint rather than a file re-read per decision: the clock stays one atomic load
//! per decision, as in the store tests, and moving it is a round trip the test awaits, so the
//! next request is decided at the new time.

use tollgate_limit::store::{AnyClock, ManualClock};

/// The environment variable that puts the gateway on a manual clock, and its start time.
pub const ENV: &str = "TOLLGATE_TEST_CLOCK";

/// The admin path that moves the clock.
pub const PATH: &str = "/-/test/clock";

/// The clock `TOLLGATE_TEST_CLOCK` asks for: a manual one at its value, or the system clock
/// when it is unset. An error names what is wrong with its value.
pub fn from_env() -> Result<AnyClock, String> {
    match std::env::var(ENV) {
        Err(std::env::VarError::NotPresent) => Ok(AnyClock::System),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ENV} is not UTF-8")),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(|now| ManualClock::new(now).into())
            .map_err(|e| format!("{ENV}={v:?}: expected microseconds since the Unix epoch ({e})")),
    }
}

/// Moves `clock` as `query` asks (`advance=<µs>` or `set=<µs>`): the status and the JSON reply.
pub fn handle(clock: &AnyClock, query: Option<&str>) -> (http::StatusCode, String) {
    use http::StatusCode;
    let AnyClock::Manual(manual) = clock else {
        return (
            StatusCode::CONFLICT,
            format!(
                r#"{{"error":"the gateway runs on the system clock; start it with {ENV}=<µs since the epoch>"}}"#
            ),
        );
    };
    let bad = || {
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":"expected ?advance=<µs> or ?set=<µs>"}"#.to_owned(),
        )
    };
    let Some((name, value)) = query.and_then(|q| q.split_once('=')) else {
        return bad();
    };
    let Ok(value) = value.parse::<u64>() else {
        return bad();
    };
    match name {
        "advance" => manual.advance(value),
        "set" => manual.set(value),
        _ => return bad(),
    }
    (StatusCode::OK, format!(r#"{{"now":{}}}"#, manual.now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limit::store::Clock;

    #[test]
    fn the_endpoint_moves_a_manual_clock_and_refuses_anything_else() {
        let clock: AnyClock = ManualClock::new(1_000).into();
        assert_eq!(handle(&clock, Some("advance=500")).0, 200);
        assert_eq!(clock.injected(), Some(1_500));
        let (code, body) = handle(&clock, Some("set=42"));
        assert_eq!((code.as_u16(), body.as_str()), (200, r#"{"now":42}"#));
        for bad in [
            None,
            Some(""),
            Some("advance"),
            Some("advance=-1"),
            Some("jump=5"),
        ] {
            assert_eq!(handle(&clock, bad).0, 400, "{bad:?}");
        }
        assert_eq!(clock.injected(), Some(42));
        assert_eq!(handle(&AnyClock::System, Some("advance=1")).0, 409);
    }
}
