//! Every error a client can see, with etcd's exact gRPC code and message.
//!
//! The strings are part of the wire contract: etcd's clients (and `etcdctl`) match on them, e.g. the Go
//! client re-authenticates on "revision of auth store is old". Keep them byte-for-byte identical to etcd's
//! `rpctypes`. Nothing else in keyward builds a `tonic::Status` for an etcd error.

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum EtcdError {
    // request validation
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    // mvcc
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    // leases
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    // auth
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    /// keyward's own: bcrypt reads at most 72 bytes, and a longer password would be cut silently.
    #[error("etcdserver: password is too long (at most 72 bytes)")]
    PasswordTooLong,
    /// etcd answers a password login to a `--no-password` user with its raw auth error (code Unknown).
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    // cluster and server state
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    #[error("etcdserver: request timed out, waiting for the applied index took too long")]
    TimeoutWaitAppliedIndex,
    // membership
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: member ID already exist")]
    MemberIdExists,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStartedMembers,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    /// The leader's answer to a request this member forwarded to it, passed on unchanged.
    #[error("{message}")]
    FromLeader { code: i32, message: String },
    /// Something keyward supports only partly so far; the message says what.
    #[error("etcdserver: {0}")]
    Unsupported(String),
    /// Defragment could not replace the database (the old one keeps serving). etcd returns its
    /// backend's error as is, with code Unknown.
    #[error("defragment failed: {0}")]
    DefragFailed(String),
    /// A storage failure inside the server; the detail is logged, not sent.
    #[error("etcdserver: internal error")]
    Internal,
    /// The member's storage is full (the disk, or LMDB's map). Never a request's apply result: the
    /// state machine aborts the batch and applies it again once there is room (`space/mod.rs`).
    #[error("etcdserver: mvcc: database space exceeded")]
    StorageFull {
        /// LMDB's map is full (not the disk).
        map: bool,
    },
    // a forwarded client certificate (`identity/rules.rs`; keyward's own, there is no etcd text)
    /// `keyward-forwarded-client-cert` on a connection whose certificate CN is not in
    /// `--trusted-proxy-cn`.
    #[error("etcdserver: peer is not a trusted proxy: keyward-forwarded-client-cert refused")]
    NotTrustedProxy,
    /// A trusted proxy forwarded a certificate that fails verification; the reason follows.
    #[error("etcdserver: forwarded client certificate refused: {0}")]
    ForwardedCertRefused(String),
    // Lock and Election (`server/concurrency/`): errors of etcd's `clientv3/concurrency` and
    // `v3election`, which its server passes on untranslated (code Unknown).
    #[error("election: not leader")]
    ElectionNotLeader,
    #[error("election: no leader")]
    ElectionNoLeader,
    #[error("\"leader\" field must be provided")]
    MissingLeaderKey,
    #[error("lost watcher waiting for delete")]
    LostWatcher,
}

impl EtcdError {
    pub fn code(&self) -> Code {
        use EtcdError::*;
        match self {
            EmptyKey | KeyNotFound | ValueProvided | LeaseProvided | TooManyOps | DuplicateKey | RequestTooLarge
            | UserEmpty | RoleEmpty | AuthFailed | InvalidAuthMgmt | AuthOldRevision | PasswordTooLong => {
                Code::InvalidArgument
            }
            Compacted | FutureRev | LeaseTtlTooLarge => Code::OutOfRange,
            NoSpace | StorageFull { .. } | TooManyRequests => Code::ResourceExhausted,
            LeaseNotFound | MemberNotFound => Code::NotFound,
            PeerUrlExists | MemberIdExists | MemberNotLearner | LearnerNotReady | TooManyLearners
            | BadLeaderTransferee => Code::FailedPrecondition,
            Unhealthy | LeaderTransferTimeout | TimeoutWaitAppliedIndex => Code::Unavailable,
            FromLeader { code, .. } => Code::from_i32(*code),
            LeaseExists | RootUserNotExist | RootRoleNotExist | UserAlreadyExist | UserNotFound | RoleAlreadyExist
            | RoleNotFound | RoleNotGranted | PermissionNotGranted | AuthNotEnabled | NotLeader => {
                Code::FailedPrecondition
            }
            PermissionDenied | NotTrustedProxy | ForwardedCertRefused(_) => Code::PermissionDenied,
            // etcd 3.4's server does not translate these into its gRPC errors: clients see Unknown.
            NoPasswordUser | NotEnoughStartedMembers | DefragFailed(_) => Code::Unknown,
            ElectionNotLeader | ElectionNoLeader | MissingLeaderKey | LostWatcher => Code::Unknown,
            InvalidAuthToken => Code::Unauthenticated,
            NoLeader | LeaderChanged | Stopped | Timeout => Code::Unavailable,
            Unsupported(_) => Code::Unimplemented,
            Internal => Code::Internal,
        }
    }
}

impl EtcdError {
    /// The error as Go's gRPC status prints it; etcd puts this text in a watch's cancel reason.
    pub fn go_status_text(&self) -> String {
        format!("rpc error: code = {:?} desc = {self}", self.code())
    }
}

impl From<Status> for EtcdError {
    /// The leader's (or any peer's) answer to a forwarded request, to pass on to the client.
    fn from(status: Status) -> EtcdError {
        match status.code() {
            // The leader did not answer in time (etcd's "request timed out"), or could not be reached
            // (it changed, or is going): both retryable for a client.
            Code::DeadlineExceeded => EtcdError::Timeout,
            _ if is_transport_failure(&status) => {
                tracing::debug!(error = %status, "forwarding to the leader failed");
                EtcdError::LeaderChanged
            }
            code => EtcdError::FromLeader { code: code as i32, message: status.message().to_string() },
        }
    }
}

/// Whether `status` is this side's failure to reach the peer or to hear its answer, not an answer: a
/// status made here from a transport error carries that error as its source (one decoded from the
/// peer's answer has none), or is the channel's Unavailable or Cancelled without etcd's text.
pub(crate) fn is_transport_failure(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
        || matches!(status.code(), Code::Unavailable | Code::Cancelled) && !status.message().starts_with("etcdserver:")
}

impl From<EtcdError> for Status {
    fn from(err: EtcdError) -> Status {
        Status::new(err.code(), err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forward whose connection broke mid-call comes back as tonic's "transport error" (code Unknown,
    /// its cause as source): the client gets etcd's retryable "leader changed", not Unknown.
    #[test]
    fn a_transport_failure_is_leader_changed_and_an_answer_is_passed_on() {
        let broken = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(broken.code(), Code::Unknown);
        assert!(is_transport_failure(&broken));
        assert_eq!(EtcdError::from(broken), EtcdError::LeaderChanged);
        let answer = Status::new(Code::Unknown, "some answer of the leader");
        assert!(!is_transport_failure(&answer));
        assert!(matches!(EtcdError::from(answer), EtcdError::FromLeader { .. }));
        assert!(is_transport_failure(&Status::unavailable("tcp connect error")));
        assert!(!is_transport_failure(&Status::from(EtcdError::NoLeader)));
    }

    #[test]
    fn statuses_carry_etcds_code_and_text() {
        let status = Status::from(EtcdError::Compacted);
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(status.message(), "etcdserver: mvcc: required revision has been compacted");
        let status = Status::from(EtcdError::AuthOldRevision);
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "etcdserver: revision of auth store is old")
        );
    }
}
