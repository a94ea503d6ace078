//! Every error the proxy itself answers with, and its gRPC status. Errors from a member pass through
//! untouched; these are the proxy's own, each with a message that names the proxy.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A gRPC service the proxy does not forward.
    #[error("keyward proxy: unknown service {0}")]
    UnknownService(String),
    /// With `--client-cert-auth` every connection carries a verified certificate; one without
    /// would reach the member as the proxy itself, so it is refused instead.
    #[error("keyward proxy: no verified client certificate to forward")]
    NoClientCertificate,
    /// No member could be connected to; nothing was sent. Each member with why.
    #[error("keyward proxy: no member reachable: {0}")]
    Unreachable(String),
    /// The request reached a member's connection, which then failed; it may or may not have been
    /// applied, so it is not retried elsewhere.
    #[error("keyward proxy: member {member} failed: {reason}")]
    MemberFailed { member: String, reason: String },
    /// The client's deadline (`grpc-timeout`) passed before any member answered.
    #[error("keyward proxy: deadline exceeded before a member answered")]
    Deadline,
}

impl ProxyError {
    pub fn code(&self) -> Code {
        match self {
            ProxyError::UnknownService(_) => Code::Unimplemented,
            ProxyError::NoClientCertificate => Code::PermissionDenied,
            ProxyError::Unreachable(_) | ProxyError::MemberFailed { .. } => Code::Unavailable,
            ProxyError::Deadline => Code::DeadlineExceeded,
        }
    }
}

impl From<ProxyError> for Status {
    fn from(err: ProxyError) -> Status {
        Status::new(err.code(), err.to_string())
    }
}
