//! One login throttle for the whole cluster: the leader's table (`auth/throttle.rs`) decides every
//! login attempt, whichever member the client called.
//!
//! Why the leader, asked over the peer port, rather than failures replicated through raft: the
//! throttle counts attempts when they are admitted, not when they failed, so concurrent attempts on
//! three members must meet in one place *before* any password is checked; a raft entry per failure
//! would come after the check (and cost a disk sync per guess under attack). The leader is where a
//! follower already sends what needs one authority (writes, read indexes, lease keep-alives), and a
//! login needs the leader anyway: its token is issued through raft. A follower's attempt is one
//! `LoginAttempt` stream to the leader, held while the password is checked here: the leader answers
//! when the attempt's turn has come, the follower sends the outcome. If the follower's client gives
//! up, the follower drops the call, the stream is reset, and the leader drops the attempt (given
//! back while waiting, a failure once checked): the guard's rules hold across the network.
//!
//! Fallback without a leader: the attempt waits for one as any request does (two election
//! timeouts), then fails with etcd's retryable "no leader" before any password is checked; a
//! login could not be completed then anyway. A new leader starts with an empty table: an election
//! gives a source at most one more free allowance (the old leader's table is not handed over).

use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::Streaming;

use super::Node;
use crate::auth::throttle::{Attempt, Source};
use crate::error::EtcdError;
use crate::proto::keywardpb::login_attempt_request::Step;
use crate::proto::keywardpb::login_attempt_start;
use crate::proto::keywardpb::{LoginAttemptReply, LoginAttemptRequest, LoginAttemptStart, LoginOutcome};

/// How long a follower's attempt may be held at the leader beyond the throttle's longest wait: the
/// password check here and the token's proposal.
const CHECK_ALLOWANCE: Duration = Duration::from_secs(60);

/// A login attempt whose turn has come: its password may be checked; then it must be told how that
/// ended. Dropped without an outcome it counts as a failure (see `auth/throttle.rs`).
pub(crate) enum LoginAttempt {
    /// This member leads: its own table.
    Here(Attempt),
    /// Held at the leader by an open `LoginAttempt` call.
    AtLeader(AtLeader),
}

pub(crate) struct AtLeader {
    outcome: tokio::sync::mpsc::Sender<LoginAttemptRequest>,
    replies: Streaming<LoginAttemptReply>,
    waited: bool,
}

impl LoginAttempt {
    /// Whether it had to wait for its turn.
    pub(crate) fn waited(&self) -> bool {
        match self {
            LoginAttempt::Here(attempt) => attempt.waited(),
            LoginAttempt::AtLeader(remote) => remote.waited,
        }
    }

    pub(crate) fn succeeded(self) {
        self.end(LoginOutcome::Succeeded);
    }

    pub(crate) fn failed(self) {
        self.end(LoginOutcome::Failed);
    }

    pub(crate) fn withdrawn(self) {
        self.end(LoginOutcome::Withdrawn);
    }

    fn end(self, outcome: LoginOutcome) {
        match self {
            LoginAttempt::Here(attempt) => match outcome {
                LoginOutcome::Succeeded => attempt.succeeded(),
                LoginOutcome::Failed => attempt.failed(),
                LoginOutcome::Withdrawn => attempt.withdrawn(),
            },
            LoginAttempt::AtLeader(AtLeader { outcome: sender, mut replies, .. }) => {
                let message = LoginAttemptRequest { step: Some(Step::Outcome(outcome as i32)) };
                // Room for it: the channel holds two messages and only the start was sent.
                let _ = sender.try_send(message);
                drop(sender);
                // The call is kept until the leader has settled the attempt and ended it: dropping it
                // earlier could reset the stream before the outcome is read (then a failure).
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(CHECK_ALLOWANCE, async {
                        while let Ok(Some(_)) = replies.message().await {}
                    })
                    .await;
                });
            }
        }
    }
}

impl Node {
    /// Admits a login attempt of `user` from `source` in the cluster's throttle and waits for its
    /// turn: here if this member leads, else at the leader. "Too many requests" when refused.
    pub(crate) async fn login_attempt(&self, user: &str, source: &Source) -> Result<LoginAttempt, EtcdError> {
        let throttle = self.auth.login_throttle.clone();
        let timeout = throttle.limits().max_delay + CHECK_ALLOWANCE;
        let attempt = self
            .on_leader(
                super::leader::Resend::IfUnsent,
                || async move { throttle.attempt(user, source).await.map(LoginAttempt::Here) },
                |mut leader, _| {
                    let (sender, steps) = tokio::sync::mpsc::channel(2);
                    let start = LoginAttemptRequest { step: Some(Step::Start(start_message(user, source))) };
                    let request = self.peers.request(ReceiverStream::new(steps), Some(timeout));
                    async move {
                        let _ = sender.send(start).await;
                        let mut replies = leader.login_attempt(request).await?.into_inner();
                        let reply = replies
                            .message()
                            .await?
                            .ok_or_else(|| tonic::Status::unavailable("the leader ended the login attempt"))?;
                        Ok(LoginAttempt::AtLeader(AtLeader { outcome: sender, replies, waited: reply.waited }))
                    }
                    .boxed()
                },
            )
            .await;
        // The leader's refusal comes back as its status: the same error here.
        attempt.map_err(|e| {
            if e.to_string() == EtcdError::TooManyRequests.to_string() {
                EtcdError::TooManyRequests
            } else {
                e
            }
        })
    }
}

fn start_message(user: &str, source: &Source) -> LoginAttemptStart {
    let source = match source {
        Source::Address(Some(std::net::IpAddr::V4(ip))) => login_attempt_start::Source::Address(ip.octets().to_vec()),
        Source::Address(Some(std::net::IpAddr::V6(ip))) => login_attempt_start::Source::Address(ip.octets().to_vec()),
        Source::Address(None) => login_attempt_start::Source::Address(Vec::new()),
        Source::Certificate(name) => login_attempt_start::Source::Certificate(name.clone()),
    };
    LoginAttemptStart { user: user.to_string(), source: Some(source) }
}

/// The attempt a follower's first message names; `None` if it names none.
pub(crate) fn decode_start(start: LoginAttemptStart) -> Option<(String, Source)> {
    let source = match start.source? {
        login_attempt_start::Source::Address(bytes) => Source::Address(match bytes.len() {
            0 => None,
            4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(bytes.as_slice()).ok()?)),
            16 => Some(std::net::IpAddr::from(<[u8; 16]>::try_from(bytes.as_slice()).ok()?)),
            _ => return None,
        }),
        login_attempt_start::Source::Certificate(name) => Source::Certificate(name),
    };
    Some((start.user, source))
}

/// Serves a follower's `LoginAttempt` call on the leader: the attempt's turn, then its outcome.
/// The follower's stream ending, or the call being dropped (the follower went away), drops the
/// attempt.
pub(crate) async fn serve_at_leader(
    node: &Node,
    mut steps: Streaming<LoginAttemptRequest>,
) -> Result<impl futures::Stream<Item = Result<LoginAttemptReply, tonic::Status>> + Send + 'static, tonic::Status> {
    let start = match steps.message().await? {
        Some(LoginAttemptRequest { step: Some(Step::Start(start)) }) => decode_start(start),
        _ => None,
    };
    let (user, source) =
        start.ok_or_else(|| tonic::Status::invalid_argument("a login attempt starts with its user and source"))?;
    // The follower sends nothing more before the turn: its stream ending first means its client gave
    // up (the call may be half-closed rather than reset), and the attempt gives its place back.
    let attempt = tokio::select! {
        attempt = node.auth.login_throttle.attempt(&user, &source) => attempt?,
        _ = steps.message() => return Err(tonic::Status::cancelled("the login attempt was given up")),
    };
    let waited = attempt.waited();
    let settle = async move {
        match steps.message().await {
            Ok(Some(LoginAttemptRequest { step: Some(Step::Outcome(outcome)) })) => {
                match LoginOutcome::try_from(outcome) {
                    Ok(LoginOutcome::Succeeded) => attempt.succeeded(),
                    Ok(LoginOutcome::Withdrawn) => attempt.withdrawn(),
                    Ok(LoginOutcome::Failed) | Err(_) => attempt.failed(),
                }
            }
            // No outcome: the follower gave up while the password was checked.
            _ => attempt.failed(),
        }
    };
    let turn = futures::stream::once(futures::future::ready(Ok(LoginAttemptReply { waited })));
    let end = futures::stream::once(settle).filter_map(|()| futures::future::ready(None));
    Ok(turn.chain(end))
}
