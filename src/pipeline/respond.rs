//! The response phase: what a route does to the head of every response it gives, the
//! upstream's and the gateway's own answers alike — the CORS headers of `[routes.cors]`, then
//! the rules of `[routes.response_headers]` (on the gateway's own answers too unless
//! `own_answers = false`). A front calls [`respond`] once per response, after the gateway's
//! own headers (rate-limit headers, `Retry-After`) are in place; a route with neither costs
//! one branch.

use http::header::{HeaderMap, HeaderValue};

use super::record::Trail;
use crate::fronting::Vars;

/// Applies the route's response-side fronting to `headers`. `own`: the gateway answered
/// itself (a 429, 401, 404, 5xx, a preflight, a redirect) rather than the upstream.
pub fn respond(trail: &Trail<'_>, request_id: &HeaderValue, own: bool, headers: &mut HeaderMap) {
    let Some(route) = trail.route else {
        return;
    };
    let f = &route.fronting;
    if !f.touches_responses() {
        return;
    }
    if let Some(c) = &f.cors {
        c.write_response(trail.origin.as_ref(), headers);
    }
    if let Some(r) = &f.response_headers {
        if !own || r.own_answers {
            let vars = Vars {
                client_ip: trail.client_ip,
                request_id: Some(request_id),
                consumer: trail.consumer.as_deref().map(|c| &*c.name),
                route: &route.name,
                claims: trail.token.as_deref().map(|v| &v.claims),
                ..Vars::default()
            };
            r.rules.apply(&vars, headers);
        }
    }
}
