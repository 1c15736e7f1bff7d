//! The hyper front's "send once" (its codec's [`crate::pipeline::cycle::Codec::send`]): one attempt of a
//! request to the server the planner picked, with the worker's pooled hyper client (the shared
//! one for a route's own `http://` URL, the group's for a group), within the route's `timeout`.
//! The planner does the rest (attempts, retry rule, health, metrics, trace). A failure is
//! blamed on the client's body when it was the body's fault; a request body is handed back
//! unread by a failed attempt (see [`crate::front::hyper::body`]) so that the next one can send it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::HOST;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::UpstreamClient;
use crate::front::hyper::body::{BodyFault, BodySlot, ClientBody, Prefix, RequestBody};
use crate::pipeline::edits::stamp_attempt;
use crate::pipeline::ProxyError;
use crate::routing::Route;
use crate::upstream::attempts::{Failed, To};
use crate::upstream::{ConnectError, Failure, Group};

/// Whose pooled client sends.
pub(crate) enum Client<'a, B = Incoming> {
    /// The worker's shared client (a route's own `http://` URL).
    Shared(&'a UpstreamClient<B>),
    /// The group's client of this worker.
    Group(usize),
}

impl<B> Clone for Client<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Client<'_, B> {}

/// A request ready to go upstream (its head already edited), sent once per attempt: the
/// client's body hyper's [`Incoming`] or, from the HTTP/3 front, its stream's.
pub(crate) struct Sender<'a, B = Incoming> {
    client: Client<'a, B>,
    /// The route's `max_body_size`.
    max_body_size: u64,
    method: Method,
    version: Version,
    headers: HeaderMap,
    /// The request's extensions (the client's header case among them: the upstream gets the
    /// names as the client spelled them, as from the fast front).
    extensions: http::Extensions,
    path_and_query: String,
    body: Option<RequestBody<B>>,
    /// Where a failed attempt hands the client's body back unread.
    slot: Option<BodySlot<B>>,
    fault: BodyFault,
    body_read_timeout: Duration,
    bodyless: bool,
}

impl<'a, B: ClientBody> Sender<'a, B> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Client<'a, B>,
        route: &Route,
        parts: http::request::Parts,
        (body, prefix): (B, Option<Prefix>),
        path_and_query: String,
        fault: BodyFault,
        body_read_timeout: Duration,
    ) -> Sender<'a, B> {
        let bodyless = body.is_end_stream() && prefix.is_none();
        Sender {
            client,
            max_body_size: route.max_body_size,
            method: parts.method,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
            path_and_query,
            body: Some(
                RequestBody::new(body, route.max_body_size, body_read_timeout, fault.clone())
                    .with_prefix(prefix),
            ),
            slot: None,
            fault,
            body_read_timeout,
            bodyless,
        }
    }

    /// The request has no body (the retry rule).
    pub(crate) fn bodyless(&self) -> bool {
        self.bodyless
    }

    /// When the upstream call failed because of the client's body (too large, too slow,
    /// malformed), the client's error; the upstream is not to blame.
    fn client_body_error(&self) -> Option<ProxyError> {
        if self.fault.too_large() {
            Some(ProxyError::BodyTooLarge(self.max_body_size))
        } else if self.fault.timed_out() {
            Some(ProxyError::BodyTimeout)
        } else if self.fault.client_failed() {
            Some(ProxyError::BadBody)
        } else {
            None
        }
    }
}

impl<B: ClientBody> Sender<'_, B> {
    /// Sends the request once to `group`'s server `to.index` (see
    /// [`crate::upstream::attempts::SendOnce::send`]).
    pub(crate) async fn send(
        &mut self,
        route: &Route,
        group: &Group,
        to: To,
    ) -> Result<Response<Incoming>, Failed<ProxyError>> {
        let server = &group.servers[to.index];
        // The head for this attempt; a copy stays for the next one.
        let (mut headers, extensions) = if to.more {
            (self.headers.clone(), self.extensions.clone())
        } else {
            (
                std::mem::take(&mut self.headers),
                std::mem::take(&mut self.extensions),
            )
        };
        if !route.preserve_host {
            headers.insert(HOST, server.host.clone());
        }
        if let Some(stamp) = to.trace {
            stamp_attempt(&mut headers, stamp);
        }
        let uri = Uri::builder()
            .scheme(server.scheme.clone())
            .authority(server.authority.clone())
            .path_and_query(self.path_and_query.as_str())
            .build()
            .map_err(|_| {
                Failed::Client(Some(ProxyError::BadRequest(
                    "the request target cannot be forwarded",
                )))
            })?;
        self.slot = to.more.then(|| Arc::new(Mutex::new(None)));
        let mut body = self.body.take().unwrap_or_else(RequestBody::empty);
        if let Some(s) = &self.slot {
            body = body.give_back_into(s.clone());
        }
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = headers;
        *req.extensions_mut() = extensions;
        let timeout = route.timeout;
        // The route's `timeout` runs while the attempt waits on the upstream, not while the
        // client sends its body (see `crate::front::hyper::body`).
        self.fault.begin_attempt();
        let result = match self.client {
            // Boxed: hyper's request futures are large, and would otherwise be part of every
            // request's future.
            Client::Shared(c) => tokio::select! {
                r = Box::pin(c.request(req)) => Ok(r),
                () = self.fault.upstream_timeout(timeout) => Err(()),
            },
            Client::Group(worker) => tokio::select! {
                r = Box::pin(group.client(worker).request(
                    req.map(|b| b.map_err(Into::into).boxed_unsync()),
                )) => Ok(r),
                () = self.fault.upstream_timeout(timeout) => Err(()),
            },
        };
        let e = match result {
            // A status outside 100-599 (hyper's client takes up to 999) is no answer to
            // relay: the attempt failed, as on the fast front (`http1::exchange`).
            Ok(Ok(response)) if response.status().as_u16() > 599 => {
                return Err(Failed::Upstream {
                    failure: Failure::Protocol(format!(
                        "invalid status code {} in the response",
                        response.status().as_u16()
                    )),
                    unsent: false,
                });
            }
            Ok(Ok(response)) => return Ok(response),
            Err(()) => {
                return Err(Failed::Upstream {
                    failure: Failure::Timeout(timeout),
                    unsent: false,
                })
            }
            Ok(Err(e)) => e,
        };
        if let Some(e) = self.client_body_error() {
            return Err(Failed::Client(Some(e)));
        }
        let (failure, unsent) = match ConnectError::find(&e) {
            Some(c) => (Failure::from(c), true),
            None if e.is_connect() => (Failure::Connect, true),
            None => (Failure::Protocol(error_chain(&e)), false),
        };
        Err(Failed::Upstream { failure, unsent })
    }

    /// The body for the next attempt: none if there never was one; else the client's stream,
    /// if the failed attempt gave it back unread.
    pub(crate) fn again(&mut self) -> bool {
        if self.bodyless {
            return true;
        }
        match self
            .slot
            .take()
            .and_then(|s| s.lock().ok().and_then(|mut g| g.take()))
        {
            Some((inner, prefix)) => {
                self.body = Some(
                    RequestBody::new(
                        inner,
                        self.max_body_size,
                        self.body_read_timeout,
                        self.fault.clone(),
                    )
                    .with_prefix(prefix),
                );
                true
            }
            None => false,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
