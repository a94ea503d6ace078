//! The gate in front of the peer protocol: every request to `keywardpb.Peer`, whatever its method
//! (a new RPC included), passes this interceptor before `peer_service.rs` sees it, and runs only if
//! its caller is a member by `admission.rs`'s rule, decided per request against the membership
//! this member has now (members come and go while connections stay open).
//!
//! A long-lived stream (`append_stream.rs`) is admitted at its start here and each of its messages
//! again by `StreamCaller`, so a member removed while its stream is open is refused from then on.
//!
//! So nothing a peer request carries (`member_internal` in a forwarded proposal's header, the user
//! name and auth revision a follower vouches for, the cluster id `Membership` answers with) is ever
//! read from anyone but a member.

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Interceptor;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Request, Status};

use super::admission::{Caller, PeerAdmission};
use crate::frontend::tls::listener::TlsConnectInfo;
use crate::logging::limit::LogLimit;
use crate::raft::Raft;

#[derive(Clone)]
pub(crate) struct PeerGuard {
    /// This member's raft, for the membership it has now.
    raft: Raft,
    member_id: u64,
    rule: Arc<PeerAdmission>,
}

impl PeerGuard {
    pub(crate) fn new(raft: Raft, member_id: u64, rule: PeerAdmission) -> Self {
        PeerGuard { raft, member_id, rule: Arc::new(rule) }
    }

    /// Whether any peer URL of a member other than this one satisfies `matches`: of the current
    /// membership, or of `--initial-cluster` while the membership is unknown (a joining member).
    fn any_other_member(&self, matches: &mut dyn FnMut(&str) -> bool) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        if membership.nodes().next().is_none() {
            return self.rule.initial_peers.iter().any(|url| matches(url));
        }
        let found = membership
            .nodes()
            .filter(|(id, _)| **id != self.member_id)
            .flat_map(|(_, node)| &node.peer_urls)
            .any(|url| matches(url));
        found
    }
}

impl Interceptor for PeerGuard {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let extensions = request.extensions();
        let tls = extensions.get::<TlsConnectInfo>();
        let remote = || match tls {
            Some(info) => info.remote_addr,
            None => extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr),
        };
        self.admit(tls, remote)?;
        // A stream's messages are admitted again, each against the membership of its time
        // (`StreamCaller`): the stream's handler finds this guard here.
        let guard = self.clone();
        request.extensions_mut().insert(guard);
        Ok(request)
    }
}

impl PeerGuard {
    /// Admits a caller (its TLS connection, or plain text) if it is a member now, or refuses it
    /// with `permission denied`, counted and logged.
    fn admit(
        &self,
        tls: Option<&TlsConnectInfo>,
        remote: impl FnOnce() -> Option<std::net::SocketAddr>,
    ) -> Result<(), Status> {
        let caller = match tls {
            Some(info) => Caller::Tls(info.certificate.as_deref()),
            None => Caller::PlainText,
        };
        let refusal = match self.rule.admit(caller, |matches| self.any_other_member(matches)) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        crate::metrics::PEER_REQUESTS_REFUSED.with_label_values(&[refusal.label()]).inc();
        // Anyone who reaches the port can cause these: at most 10 lines per reason per 10 s.
        static LIMIT: LogLimit = LogLimit::new(10, Duration::from_secs(10));
        if let Some(suppressed) = LIMIT.admit(refusal.label()) {
            let common_name = tls.and_then(|info| info.identity.common_name()).unwrap_or_default();
            tracing::warn!(
                remote = ?remote(),
                common_name,
                reason = %refusal,
                suppressed_before = suppressed,
                "peer request refused: the caller is not a member of this cluster"
            );
        }
        Err(Status::permission_denied(format!("peer request refused: {refusal}")))
    }
}

/// The caller of a long-lived stream, as its connection established it, with the guard that admitted
/// the stream: a stream outlives membership changes (a member removed while its stream is open), so
/// each message on it is admitted again (`admit_again`), as a request of its own would be.
pub(crate) struct StreamCaller {
    guard: PeerGuard,
    tls: Option<TlsConnectInfo>,
    remote: Option<std::net::SocketAddr>,
}

impl StreamCaller {
    /// The caller of a stream this member's guard admitted; refused if no guard did (a service
    /// served without it).
    pub(crate) fn of<T>(request: &Request<T>) -> Result<Self, Status> {
        let extensions = request.extensions();
        let Some(guard) = extensions.get::<PeerGuard>().cloned() else {
            return Err(Status::permission_denied("peer request refused: no peer guard admitted the stream"));
        };
        let tls = extensions.get::<TlsConnectInfo>().cloned();
        let remote = match &tls {
            Some(info) => info.remote_addr,
            None => extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr),
        };
        Ok(StreamCaller { guard, tls, remote })
    }

    /// Whether the caller is still a member, by the membership this member has now.
    pub(crate) fn admit_again(&self) -> Result<(), Status> {
        self.guard.admit(self.tls.as_ref(), || self.remote)
    }
}
