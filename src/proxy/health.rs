//! Health checks of the members, and the proxy's own `/health`.
//!
//! Every `CHECK_INTERVAL` each member gets `GET /health?exclude=NOSPACE` on the proxy's connection to
//! it (opened if needed, so a member that comes back is noticed): a 200 within `CHECK_TIMEOUT` marks it
//! up, anything else down. NOSPACE is excluded because the alarm is cluster-wide: it would mark every
//! member down while reads and deletes still work. A down member is tried only after the healthy
//! ones (`upstream.rs`), and a failed connect marks it down at once, between checks.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};

use super::body::{full, Body};
use super::upstream::{error_chain, Member, Upstreams};

pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(2);
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Starts one checking task per member; they end when the proxy's `Upstreams` is dropped.
pub(crate) fn spawn_checks(upstreams: &Arc<Upstreams>) {
    for index in 0..upstreams.members().len() {
        let upstreams = Arc::downgrade(upstreams);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(upstreams) = upstreams.upgrade() else { return };
                let member = &upstreams.members()[index];
                match tokio::time::timeout(CHECK_TIMEOUT, check(&upstreams, member)).await {
                    Ok(Ok(())) => member.mark_up(),
                    Ok(Err(why)) => member.mark_down(&why),
                    Err(_) => member.mark_down(&format!("/health did not answer within {CHECK_TIMEOUT:?}")),
                }
            }
        });
    }
}

async fn check(upstreams: &Upstreams, member: &Member) -> Result<(), String> {
    let mut sender = upstreams.sender_for_check(member).await?;
    let uri = format!("{}/health?exclude=NOSPACE", member.endpoint.authority_uri());
    let request = Request::get(uri).body(Body::default()).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| error_chain(&e))?;
    match response.status() {
        StatusCode::OK => Ok(()),
        status => Err(format!("/health answered {status}")),
    }
}

/// The proxy's `/health`: healthy while at least one member passed its last check (etcd's
/// grpc-proxy answers the same JSON).
pub(crate) fn proxy_health(upstreams: &Upstreams) -> Response<Body> {
    let (status, body) = if upstreams.any_healthy() {
        (StatusCode::OK, r#"{"health":"true"}"#)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false","reason":"no member passed its health check"}"#)
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}
