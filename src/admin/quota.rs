//! `GET /-/usage?consumer=NAME`: a consumer's usage for support, the body a `usage = true`
//! route answers the consumer itself (see [`crate::quota`]).

use http::StatusCode;
use serde_json::json;

use super::params;
use crate::consumers::Consumer;
use crate::quota::{limits_of, usage, usage_body};
use crate::state::Snapshot;

fn error(status: StatusCode, message: impl Into<String>) -> (StatusCode, String) {
    (status, json!({ "error": message.into() }).to_string())
}

/// The consumer named `name`, or the 404 saying there is none.
pub(super) fn consumer<'s>(
    snap: &'s Snapshot,
    name: &str,
) -> Result<&'s Consumer, (StatusCode, String)> {
    if snap.config.consumers.is_none() {
        return Err(error(
            StatusCode::NOT_FOUND,
            "no [consumers] section: this gateway knows no consumers",
        ));
    }
    snap.consumers.by_name(name).ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            format!(
                "no consumer named {name:?} in the consumers file ({} consumers)",
                snap.consumers.len()
            ),
        )
    })
}

/// The status and JSON body of `GET /-/usage?query`.
pub async fn usage_of(snap: &Snapshot, query: Option<&str>) -> (StatusCode, String) {
    let mut name = None;
    match params(query) {
        Ok(ps) => {
            for p in ps {
                match p.name.as_str() {
                    "consumer" => name = Some(String::from_utf8_lossy(&p.value).into_owned()),
                    other => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            format!("unknown parameter {other:?}; expected consumer"),
                        )
                    }
                }
            }
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    }
    let Some(name) = name else {
        return error(
            StatusCode::BAD_REQUEST,
            "consumer is required (e.g. ?consumer=acme)",
        );
    };
    let c = match consumer(snap, &name) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let plan = snap
        .config
        .plans
        .get(c.plan)
        .map_or("", |p| p.name.as_str());
    let listed = limits_of(snap, c.plan);
    match usage(snap, &listed, c.subject).await {
        Ok(limits) => (StatusCode::OK, usage_body(Some(&c.name), plan, limits)),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store cannot answer: {e}"),
        ),
    }
}
