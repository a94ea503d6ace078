//! What a long-lived stream (a watch, a lease keep-alive) was opened with, and when that stops
//! standing.
//!
//! A stream's identity is fixed when it opens. A token (from Authenticate, directly or through the
//! gateway's Basic credentials) is void once its user's password changes, the user is deleted or auth
//! is disabled; a stream opened with one then ends with etcd's "revision of auth store is old",
//! decided at the apply that voided it (`Node::auth_changes`), not on a timer and not only when the
//! client next sends. A certificate names its user afresh at every check, so a stream opened with one
//! is judged by that user's current permissions alone (the watcher's own check), as are requests
//! without credentials.

use tonic::{Request, Status};

use super::requester::identified;
use crate::auth::check::Authorizer;
use crate::error::EtcdError;
use crate::identity::{Identity, Requester};
use crate::node::Node;

#[derive(Clone, Debug)]
pub(crate) struct StreamCredential {
    who: Requester,
    token: Option<Token>,
}

/// A stream opened with a token.
#[derive(Clone, Copy, Debug)]
struct Token {
    /// Auth was on when the stream opened, so the token was what admitted it. A token sent while auth
    /// is off admits nothing; it is judged only once auth is on again.
    judged: bool,
}

impl StreamCredential {
    /// The credential a stream request presents (refused as any request with it would be).
    pub(crate) fn of<T>(node: &Node, request: &Request<T>) -> Result<StreamCredential, Status> {
        let (identity, who) = identified(node, request)?;
        let token = matches!(identity, Identity::Token { .. }).then(|| Token { judged: node.auth_enabled() });
        Ok(StreamCredential { who, token })
    }

    /// A credential that is never voided, only judged by current permissions.
    #[cfg(test)]
    pub(crate) fn standing(who: Requester) -> StreamCredential {
        StreamCredential { who, token: None }
    }

    /// Who the stream runs as.
    pub(crate) fn requester(&self) -> &Requester {
        &self.who
    }

    /// Whether the credential still stands in `authz`'s auth state: `AuthOldRevision` once a token
    /// is void.
    pub(crate) fn stands(&self, authz: &Authorizer, op: &'static str) -> Result<(), EtcdError> {
        match self.token {
            Some(token) if token.judged || authz.enabled() => authz.token_stands(&self.who, op),
            _ => Ok(()),
        }
    }

    /// Resolves with the error the stream ends with, at the first applied auth change after which the
    /// credential no longer stands; never, for a credential that cannot be voided.
    pub(crate) async fn voided(&self, node: &Node, op: &'static str) -> EtcdError {
        if self.token.is_none() {
            return std::future::pending().await;
        }
        // Subscribed before the first check: no change between the two goes unnoticed.
        let mut changes = node.auth_changes();
        loop {
            let credential = self.clone();
            let checked =
                node.read_state(move |state, txn| credential.stands(&Authorizer::new(&state.auth, txn)?, op)).await;
            if let Err(e) = checked {
                return e;
            }
            if changes.changed().await.is_err() {
                // The member is shutting down: its streams end with it.
                return std::future::pending().await;
            }
        }
    }
}
