//! The upstream-attempt planner: one request's attempts on a server group, written once for
//! every front (nginx's `proxy_next_upstream error timeout`, up to the group's `retries`). Each
//! front supplies only "send once" ([`SendOnce`]): write the request to the server it is given
//! and read the response head, saying on failure whether nothing of the request reached the
//! server. Everything else is here: how many attempts (`1 + min(retries, servers - 1)`), the
//! pick of a server not yet tried, the group's retry counter, the server's in-flight count, the
//! attempt's timing, passive health, the server's and the route's upstream metrics per outcome,
//! the trace's attempt span, the "attempt failed" debug line and the retry rule.
//!
//! The retry rule ([`may_send_again`]): the request goes to another server only when it can be
//! sent again unchanged — nothing of it reached the failed server (a connect or TLS failure), or
//! it is idempotent (GET, HEAD, OPTIONS, PUT, DELETE) and has no body. A body that was
//! streamed, even in part, is never replayed. A response, whatever its status, is the answer
//! (no retry on 5xx). Limits were charged once, before this; retries never are. A failure that
//! is the client's (its body too large, too slow or malformed, or the client leaving) ends the
//! attempts without blaming the server.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{Method, StatusCode};

use super::failure::Failure;
use super::group::{Group, InFlight, Pick, Tried};
use crate::metrics::RouteMetrics;

/// The retry rule, one for every front: whether a request whose attempt failed may be sent
/// again — to another server, or (the fast front) on a new connection when a reused idle one
/// closed under it. Only when nothing of it reached the server (`unsent`), or it is idempotent
/// (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`) and has no body: a `POST` that was written is
/// never written twice.
pub fn may_send_again(method: &Method, bodyless: bool, unsent: bool) -> bool {
    let idempotent = matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    );
    unsent || (idempotent && bodyless)
}

/// What one attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Not finished (the request was abandoned during it).
    Pending,
    /// A response head with this status.
    Status(u16),
    /// No response head: `connect`, `tls`, `timeout`, `other` (the upstream error kinds), or
    /// `client_body` (the client's body failed it).
    Error(&'static str),
}

/// What records a request's attempts, one span each (a traced request's trail,
/// `crate::traces::TraceTrail`).
pub trait AttemptSpans {
    /// Starts an attempt to `server`: its span, and the trace context to send it
    /// (`traceparent`, and `tracestate` or none).
    fn begin_attempt(&mut self, server: &Arc<str>) -> (HeaderValue, Option<HeaderValue>);
    /// Ends the attempt begun last.
    fn end_attempt(&mut self, outcome: AttemptOutcome);
}

/// Where the planner records a request's attempts: the server tried last (`host:port`) with the
/// time to its response head or failure, and a traced request's attempt spans.
pub type Records<'t, 'g> = (
    &'t mut Option<(&'g Arc<str>, Duration)>,
    Option<&'t mut (dyn AttemptSpans + Send + 'g)>,
);

/// The request the attempts are for, as the planner needs it.
pub struct Plan<'g, 'r> {
    pub group: &'g Group,
    /// The worker the request runs on (its pools, its round-robin counter).
    pub worker: usize,
    /// The route's metrics (upstream latency, responses by class, errors by kind).
    pub metrics: &'r RouteMetrics,
    pub method: &'r Method,
    /// The request has no body (the retry rule).
    pub bodyless: bool,
    /// The client's address (`ip_hash`).
    pub client: IpAddr,
}

/// One attempt as the front sends it.
pub struct To {
    /// The server's index in the plan's group (`group.servers[index]`; the fast front's pool
    /// of its connections). An index rather than a reference: the attempt's future then
    /// borrows nothing but the sender (see rust-lang/rust#100013).
    pub index: usize,
    /// Another attempt may follow this one: what the request needs to go again must stay.
    pub more: bool,
    /// The trace context this attempt carries (`traceparent`, and `tracestate` or none),
    /// replacing the client's, on a traced request.
    pub trace: Option<(HeaderValue, Option<HeaderValue>)>,
}

/// Why one attempt failed.
#[derive(Debug)]
pub enum Failed<C> {
    /// The client's doing (the front's fault, e.g. its body too large), or the client left
    /// (`None`): the server is not blamed and no further attempt is made.
    Client(Option<C>),
    /// The upstream failed; `unsent`: nothing of the request reached it.
    Upstream { failure: Failure, unsent: bool },
}

/// Why the attempts ended without a response.
#[derive(Debug)]
pub enum Stop<C> {
    /// The client's doing (see [`Failed::Client`]).
    Client(Option<C>),
    /// The last attempt's failure (or no live server).
    Upstream(Failure),
}

/// What a front does to send a request once.
pub trait SendOnce {
    /// What an answered attempt gives (at least the response head).
    type Response;
    /// A failure that is the client's.
    type Fault;

    /// Sends the request to the group's server `to.index` and reads its response head.
    fn send(
        &mut self,
        to: To,
    ) -> impl Future<Output = Result<Self::Response, Failed<Self::Fault>>> + Send;

    /// The response head's status.
    fn status(response: &Self::Response) -> StatusCode;

    /// After a failed attempt the retry rule lets go again: whether the request is still whole
    /// to be sent (e.g. its body was given back unread). `false` ends the attempts.
    fn again(&mut self) -> bool {
        true
    }
}

/// Runs the request's attempts on `plan.group` with `sender`. `upstream` is set, on every
/// attempt, to the server tried (`host:port`) and the time to its response head or failure:
/// after the call, the server that answered or failed last (the access log's `upstream`). On a
/// traced request each attempt is a span of `trace`.
pub async fn run<'g, S: SendOnce>(
    plan: Plan<'g, '_>,
    sender: &mut S,
    (upstream, mut trace): Records<'_, 'g>,
) -> Result<(S::Response, Option<InFlight>), Stop<S::Fault>> {
    let group = plan.group;
    let attempts = 1 + (group.retries as usize).min(group.servers.len().saturating_sub(1));
    let key = if group.hashes_ip() {
        super::balance::hash_ip(plan.client)
    } else {
        0
    };
    let mut tried = Tried::default();
    let mut last: Option<Failure> = None;
    for attempt in 0..attempts {
        let a = match group.pick(plan.worker, key, &tried) {
            Pick::Server(a) => a,
            Pick::NoLive => return Err(Stop::Upstream(last.unwrap_or(Failure::NoLive))),
        };
        tried.add(a.index);
        if attempt > 0 {
            group.count_retry();
        }
        let server = a.server();
        let more = attempt + 1 < attempts;
        let stamp = trace.as_deref_mut().map(|t| t.begin_attempt(&server.addr));
        let in_flight = group.in_flight(a.index);
        let t0 = Instant::now();
        let result = sender
            .send(To {
                index: a.index,
                more,
                trace: stamp,
            })
            .await;
        let took = t0.elapsed();
        *upstream = Some((&server.addr, took));
        let metrics = server.state.metrics();
        let (failure, unsent) = match result {
            Ok(response) => {
                let status = S::status(&response);
                if let Some(t) = trace.as_deref_mut() {
                    t.end_attempt(AttemptOutcome::Status(status.as_u16()));
                }
                // Latency of responses only: failures would drag the quantiles toward zero
                // (or the timeout); they are counted as errors.
                plan.metrics.upstream_duration.record(took.as_secs_f64());
                plan.metrics.upstream_response(status);
                if let Some(m) = metrics {
                    m.response(status);
                }
                a.succeeded();
                return Ok((response, in_flight));
            }
            // The attempt (dropped) gives a health trial back: the server is not to blame.
            Err(Failed::Client(fault)) => {
                if let (Some(t), Some(_)) = (trace.as_deref_mut(), &fault) {
                    t.end_attempt(AttemptOutcome::Error("client_body"));
                }
                return Err(Stop::Client(fault));
            }
            Err(Failed::Upstream { failure, unsent }) => (failure, unsent),
        };
        failure.count(plan.metrics);
        drop(in_flight);
        if let Some(t) = trace.as_deref_mut() {
            t.end_attempt(AttemptOutcome::Error(failure.kind()));
        }
        if let Some(m) = metrics {
            m.error();
        }
        tracing::debug!(upstream = &*group.name, server = %server.authority, error = %failure, "attempt failed");
        a.failed();
        if !more || !may_send_again(plan.method, plan.bodyless, unsent) || !sender.again() {
            return Err(Stop::Upstream(failure));
        }
        last = Some(failure);
    }
    Err(Stop::Upstream(last.unwrap_or(Failure::NoLive)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::upstream::{ServerSpec, UpstreamConfig, UpstreamTls};
    use crate::upstream::Carried;

    /// A group of three servers with `retries = 2` and passive health off.
    fn group() -> Group {
        let servers = (1..=3)
            .map(|i| ServerSpec {
                url: crate::config::UpstreamUrl::try_from(format!("http://127.0.0.{i}:9")).unwrap(),
                weight: 1,
            })
            .collect();
        let c = UpstreamConfig {
            name: "g".into(),
            servers,
            balance: Default::default(),
            max_fails: 0,
            fail_timeout: Duration::from_secs(10),
            retries: 2,
            connect_timeout: Duration::from_secs(1),
            health_check: None,
            tls: UpstreamTls::default(),
            protocol: Default::default(),
        };
        Group::build(&c, 1, &Carried::new()).unwrap()
    }

    /// Answers each attempt from a script; records the servers tried.
    struct Scripted {
        script: Vec<Result<u16, Failed<&'static str>>>,
        tried: Vec<usize>,
        whole: bool,
    }

    impl SendOnce for Scripted {
        type Response = u16;
        type Fault = &'static str;

        async fn send(&mut self, to: To) -> Result<u16, Failed<&'static str>> {
            self.tried.push(to.index);
            assert_eq!(
                to.more,
                self.tried.len() < 3,
                "`more` until the last attempt"
            );
            self.script.remove(0)
        }

        fn status(r: &u16) -> StatusCode {
            StatusCode::from_u16(*r).unwrap()
        }

        fn again(&mut self) -> bool {
            self.whole
        }
    }

    fn upstream(failure: Failure, unsent: bool) -> Result<u16, Failed<&'static str>> {
        Err(Failed::Upstream { failure, unsent })
    }

    async fn run_on(
        g: &Group,
        method: Method,
        bodyless: bool,
        s: &mut Scripted,
    ) -> Result<u16, Stop<&'static str>> {
        let metrics = crate::metrics::RouteMetrics::new(&Arc::from("r"));
        let plan = Plan {
            group: g,
            worker: 0,
            metrics: &metrics,
            method: &method,
            bodyless,
            client: IpAddr::from([127, 0, 0, 1]),
        };
        let mut last = None;
        let r = run(plan, s, (&mut last, None)).await.map(|(r, _)| r);
        assert_eq!(
            last.map(|(addr, _)| addr.to_string()),
            s.tried.last().map(|i| g.servers[*i].addr.to_string()),
            "the access log names the server tried last"
        );
        r
    }

    #[tokio::test]
    async fn attempts_follow_the_retry_rule() {
        let g = group();
        let timeout = || Failure::Timeout(Duration::from_secs(1));
        // Idempotent and bodyless: every server once, then the last failure.
        let mut s = Scripted {
            script: vec![
                upstream(timeout(), false),
                upstream(timeout(), false),
                upstream(Failure::Connect, true),
            ],
            tried: vec![],
            whole: true,
        };
        let r = run_on(&g, Method::GET, true, &mut s).await;
        assert!(matches!(r, Err(Stop::Upstream(Failure::Connect))), "{r:?}");
        let mut tried = s.tried.clone();
        tried.sort_unstable();
        assert_eq!(tried, [0, 1, 2], "three different servers");
        // An answer, whatever its status, ends the attempts.
        let mut s = Scripted {
            script: vec![upstream(Failure::Connect, true), Ok(503)],
            tried: vec![],
            whole: true,
        };
        assert_eq!(run_on(&g, Method::GET, true, &mut s).await.unwrap(), 503);
        assert_eq!(s.tried.len(), 2);
        // A POST that reached the server is never sent again.
        let mut s = Scripted {
            script: vec![upstream(Failure::Protocol("reset".into()), false)],
            tried: vec![],
            whole: true,
        };
        let r = run_on(&g, Method::POST, false, &mut s).await;
        assert!(
            matches!(r, Err(Stop::Upstream(Failure::Protocol(_)))),
            "{r:?}"
        );
        assert_eq!(s.tried.len(), 1);
        // ... one that did not may go again, if the front still has it whole.
        let mut s = Scripted {
            script: vec![upstream(Failure::Connect, true), Ok(200)],
            tried: vec![],
            whole: true,
        };
        assert_eq!(run_on(&g, Method::POST, false, &mut s).await.unwrap(), 200);
        let mut s = Scripted {
            script: vec![upstream(Failure::Connect, true)],
            tried: vec![],
            whole: false,
        };
        assert!(run_on(&g, Method::POST, false, &mut s).await.is_err());
        assert_eq!(s.tried.len(), 1, "the body was not given back");
        // The client's fault ends the attempts, the server not blamed.
        let mut s = Scripted {
            script: vec![Err(Failed::Client(Some("too large")))],
            tried: vec![],
            whole: true,
        };
        let r = run_on(&g, Method::GET, true, &mut s).await;
        assert!(matches!(r, Err(Stop::Client(Some("too large")))), "{r:?}");
        assert_eq!(s.tried.len(), 1);
    }

    #[test]
    fn only_unsent_or_idempotent_bodyless_requests_go_again() {
        assert!(may_send_again(&Method::GET, true, false));
        assert!(may_send_again(&Method::DELETE, true, false));
        assert!(!may_send_again(&Method::GET, false, false));
        assert!(!may_send_again(&Method::POST, true, false));
        assert!(!may_send_again(&Method::PATCH, true, false));
        assert!(may_send_again(&Method::POST, false, true));
    }
}
