//! How a gateway request becomes a gRPC call of the listener's own services: the connection's
//! extensions as the listener attached them, and the token the request's credentials stand for.

use std::sync::Arc;

use http::Extensions;
use tonic::metadata::MetadataValue;
use tonic::service::Routes;
use tonic::Status;

use super::logins::{Login, Logins, Source};
use super::reply::Failure;
use crate::error::EtcdError;
use crate::identity::credentials::{Basic, Credentials};
use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::{AuthStatusRequest, AuthUserGetRequest, AuthenticateRequest};

/// The gateway of one listener: the gRPC services it calls and the credentials it verified.
#[derive(Clone)]
pub(super) struct Gateway {
    shared: Arc<Shared>,
}

struct Shared {
    grpc: Routes,
    logins: Logins,
    body_limit: usize,
}

/// The call's token, from the request's credentials.
pub(super) enum Token {
    /// Nothing to send: no credentials, or Basic credentials while auth is disabled.
    None,
    /// The client's own `Authorization: <token>`.
    Presented(String),
    /// Issued for the client's Basic credentials (refreshed when the member refuses it as stale).
    Login(Login),
}

impl Token {
    pub(super) fn value(&self) -> Option<&str> {
        match self {
            Token::None => None,
            Token::Presented(token) => Some(token),
            Token::Login(login) => Some(&login.token),
        }
    }
}

impl Gateway {
    /// A gateway calling `grpc`; request bodies over `body_limit` bytes are refused as too large.
    pub(super) fn new(grpc: Routes, body_limit: usize) -> Gateway {
        Gateway { shared: Arc::new(Shared { grpc, logins: Logins::new(), body_limit }) }
    }

    pub(super) fn grpc(&self) -> Routes {
        self.shared.grpc.clone()
    }

    pub(super) fn body_limit(&self) -> usize {
        self.shared.body_limit
    }

    /// The token a call with these credentials carries. Basic credentials that fail to verify are
    /// refused with 401 and Authenticate's error.
    pub(super) async fn token(&self, credentials: &Credentials, extensions: &Extensions) -> Result<Token, Failure> {
        match credentials {
            Credentials::None => Ok(Token::None),
            Credentials::Token(token) => Ok(Token::Presented(token.clone())),
            Credentials::Basic(basic) => {
                Ok(self.login(basic, extensions).await?.map_or(Token::None, |(l, _)| Token::Login(l)))
            }
        }
    }

    async fn login(&self, basic: &Basic, extensions: &Extensions) -> Result<Option<(Login, Source)>, Failure> {
        let login = self.shared.logins.login(basic, || self.authenticate(basic, extensions)).await;
        let outcome = match &login {
            Ok(Some((_, Source::Cached))) => "cached",
            Ok(Some((_, Source::Verified))) => "verified",
            Ok(None) => return Ok(None),
            Err(status) if refused(status) => "refused",
            Err(status) => return Err(Failure::new(status.clone())),
        };
        crate::metrics::GATEWAY_BASIC_LOGINS.with_label_values(&[outcome]).inc();
        login.map_err(Failure::unauthorized)
    }

    /// Authenticate through the gRPC service. `None`: auth is not enabled (as etcd's clients do, the
    /// request then goes ahead without a token).
    async fn authenticate(&self, basic: &Basic, extensions: &Extensions) -> Result<Option<Login>, Status> {
        let status = auth(self.grpc()).auth_status(call_request(AuthStatusRequest {}, extensions, None)?).await?;
        let status = status.into_inner();
        if !status.enabled {
            return Ok(None);
        }
        let request = AuthenticateRequest { name: basic.user.clone(), password: basic.password.clone() };
        match auth(self.grpc()).authenticate(call_request(request, extensions, None)?).await {
            Ok(response) => Ok(Some(Login { token: response.into_inner().token })),
            Err(status) if is(&status, EtcdError::AuthNotEnabled) => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// A token good for opening a stream. A stream's identity is fixed when it opens, so a cached
    /// login is checked first: its token must still stand (it may have expired, or its user's password
    /// changed); otherwise the credentials are verified again.
    pub(super) async fn stream_token(
        &self,
        credentials: &Credentials,
        extensions: &Extensions,
    ) -> Result<Token, Failure> {
        let Credentials::Basic(basic) = credentials else { return self.token(credentials, extensions).await };
        let Some((login, source)) = self.login(basic, extensions).await? else { return Ok(Token::None) };
        if source == Source::Verified || self.still_current(basic, &login, extensions).await? {
            return Ok(Token::Login(login));
        }
        self.shared.logins.forget(basic, &login).await;
        Ok(self.login(basic, extensions).await?.map_or(Token::None, |(login, _)| Token::Login(login)))
    }

    /// Whether the login's token still stands: reading the user's own record with it succeeds.
    async fn still_current(&self, basic: &Basic, login: &Login, extensions: &Extensions) -> Result<bool, Failure> {
        let own = AuthUserGetRequest { name: basic.user.clone() };
        match auth(self.grpc()).user_get(call_request(own, extensions, Some(&login.token))?).await {
            Ok(_) => Ok(true),
            Err(status) if stale(&status) => Ok(false),
            Err(status) => Err(status.into()),
        }
    }

    /// Forgets a login whose token the member refused as stale; true if it was one.
    pub(super) async fn forget_if_stale(&self, credentials: &Credentials, token: &Token, status: &Status) -> bool {
        match (credentials, token) {
            (Credentials::Basic(basic), Token::Login(login)) if stale(status) => {
                self.shared.logins.forget(basic, login).await;
                true
            }
            _ => false,
        }
    }
}

/// The gRPC request for one gateway call: the message, the connection's extensions as the listener
/// attached them (the client certificate's identity), and the token, if any, as the `token`
/// metadata etcd's clients send. Nothing else from the HTTP request is carried over.
/// A token that cannot be sent as metadata is an invalid token, never a request without one.
pub(super) fn call_request<M>(
    message: M,
    extensions: &Extensions,
    token: Option<&str>,
) -> Result<tonic::Request<M>, Status> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(token) = token {
        let value = MetadataValue::try_from(token).map_err(|_| Status::from(EtcdError::InvalidAuthToken))?;
        metadata.insert(crate::identity::metadata::TOKEN, value);
    }
    Ok(tonic::Request::from_parts(metadata, extensions.clone(), message))
}

/// Authenticate refused the credentials themselves (wrong password, no such user, a certificate-only
/// user): the request is answered 401. Any other failure (no leader, ...) keeps etcd's status.
fn refused(status: &Status) -> bool {
    is(status, EtcdError::AuthFailed) || is(status, EtcdError::NoPasswordUser)
}

/// The member refused the token itself (expired, or issued before the auth revision moved): a login
/// holding it must be verified again.
fn stale(status: &Status) -> bool {
    is(status, EtcdError::InvalidAuthToken) || is(status, EtcdError::AuthOldRevision)
}

fn is(status: &Status, error: EtcdError) -> bool {
    status.code() == error.code() && status.message() == error.to_string()
}

pub(super) fn auth(grpc: Routes) -> AuthClient<Routes> {
    AuthClient::new(grpc).max_decoding_message_size(usize::MAX)
}
