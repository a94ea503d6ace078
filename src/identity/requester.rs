//! Who a request runs as, as the raft entry header and the checks see it: the member itself, or a
//! client (its user name, the auth revision its identity was established at, and where it came from).
//! `rules.rs` decides the identity; `Identity::requester` turns it into the `Requester` that
//! `auth/check.rs` judges and that the raft header carries (`from_header` reads it back at apply).

use std::net::SocketAddr;

use crate::proto::etcdserverpb::RequestHeader;

/// Who a request runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Requester {
    /// The member itself (lease expiry, checkpoints): never subject to permissions.
    Member,
    /// A client: the user it authenticated as (empty when none), the auth revision its identity
    /// was established at, and where it came from (for the audit log only; never decides anything).
    Client { username: String, revision: u64, origin: Origin },
}

/// Where a client request came from and how it identified itself: for the audit log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    pub client: Option<SocketAddr>,
    pub credential: Credential,
}

/// How a client identified itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Credential {
    #[default]
    Unknown,
    None,
    Token,
    Certificate,
    ForwardedCertificate,
    Password,
}

impl Credential {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Credential::Unknown => "unknown",
            Credential::None => "none",
            Credential::Token => "token",
            Credential::Certificate => "certificate",
            Credential::ForwardedCertificate => "forwarded_certificate",
            Credential::Password => "password",
        }
    }

    fn parse(text: &str) -> Credential {
        match text {
            "none" => Credential::None,
            "token" => Credential::Token,
            "certificate" => Credential::Certificate,
            "forwarded_certificate" => Credential::ForwardedCertificate,
            "password" => Credential::Password,
            _ => Credential::Unknown,
        }
    }
}

impl Requester {
    pub(crate) fn client(username: String, revision: u64) -> Requester {
        Requester::Client { username, revision, origin: Origin::default() }
    }

    pub(crate) fn from_header(header: Option<&RequestHeader>) -> Requester {
        match header {
            Some(h) if h.member_internal => Requester::Member,
            Some(h) => Requester::Client {
                username: h.username.clone(),
                revision: h.auth_revision,
                origin: Origin {
                    client: h.audit_client.parse().ok(),
                    credential: Credential::parse(&h.audit_credential),
                },
            },
            None => Requester::anonymous(),
        }
    }

    pub(crate) fn anonymous() -> Requester {
        Requester::client(String::new(), 0)
    }

    /// The same requester, recorded as coming from `origin`.
    pub(crate) fn with_origin(self, origin: Origin) -> Requester {
        match self {
            Requester::Client { username, revision, .. } => Requester::Client { username, revision, origin },
            member => member,
        }
    }

    /// The name a refusal is logged under (`auth/check.rs`).
    pub(crate) fn describe(&self) -> &str {
        match self {
            Requester::Member => "<member>",
            Requester::Client { username, .. } => username,
        }
    }
}
