//! The gateway's paths: etcd 3.4's grpc-gateway table (`etcdserverpb/gw/rpc.pb.gw.go`), each path
//! calling one gRPC method, plus etcd 3.5's `/v3/auth/status`, and the Lock and Election paths of
//! `v3lockpb/gw` and `v3electionpb/gw`.

use axum::Router;
use futures::future::BoxFuture;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Request, Status, Streaming};

use super::calls::{auth, Gateway};
use super::streams::{bidirectional, server_stream};
use super::unary::unary;
use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse, WatchRequest, WatchResponse};
use crate::proto::v3electionpb::election_client::ElectionClient;
use crate::proto::v3lockpb::lock_client::LockClient;

/// Request bodies may be this much larger than `--max-request-bytes`: bytes travel as base64 (a third
/// larger), and JSON adds field names and escapes.
const BODY_FACTOR: usize = 2;
const BODY_SLACK: usize = 64 * 1024;

/// The gateway's routes for a listener whose gRPC services are `grpc`, for requests of at most
/// `max_request_bytes` (the member's `--max-request-bytes`). Merge them into the listener's router.
pub(crate) fn router(grpc: Routes, max_request_bytes: usize) -> Router {
    let body_limit = max_request_bytes.saturating_mul(BODY_FACTOR).saturating_add(BODY_SLACK);
    let gateway = Gateway::new(grpc, body_limit);
    Router::new()
        // KV
        .route("/v3/kv/range", unary(|g, r| async move { kv(g).range(r).await }))
        .route("/v3/kv/put", unary(|g, r| async move { kv(g).put(r).await }))
        .route("/v3/kv/deleterange", unary(|g, r| async move { kv(g).delete_range(r).await }))
        .route("/v3/kv/txn", unary(|g, r| async move { kv(g).txn(r).await }))
        .route("/v3/kv/compaction", unary(|g, r| async move { kv(g).compact(r).await }))
        // Watch
        .route("/v3/watch", bidirectional(watch))
        // Lease (the /v3/kv/lease/* paths are etcd's older aliases)
        .route("/v3/lease/grant", unary(|g, r| async move { lease(g).lease_grant(r).await }))
        .route("/v3/lease/revoke", unary(|g, r| async move { lease(g).lease_revoke(r).await }))
        .route("/v3/kv/lease/revoke", unary(|g, r| async move { lease(g).lease_revoke(r).await }))
        .route("/v3/lease/keepalive", bidirectional(lease_keep_alive))
        .route("/v3/lease/timetolive", unary(|g, r| async move { lease(g).lease_time_to_live(r).await }))
        .route("/v3/kv/lease/timetolive", unary(|g, r| async move { lease(g).lease_time_to_live(r).await }))
        .route("/v3/lease/leases", unary(|g, r| async move { lease(g).lease_leases(r).await }))
        .route("/v3/kv/lease/leases", unary(|g, r| async move { lease(g).lease_leases(r).await }))
        // Cluster
        .route("/v3/cluster/member/add", unary(|g, r| async move { cluster(g).member_add(r).await }))
        .route("/v3/cluster/member/remove", unary(|g, r| async move { cluster(g).member_remove(r).await }))
        .route("/v3/cluster/member/update", unary(|g, r| async move { cluster(g).member_update(r).await }))
        .route("/v3/cluster/member/list", unary(|g, r| async move { cluster(g).member_list(r).await }))
        .route("/v3/cluster/member/promote", unary(|g, r| async move { cluster(g).member_promote(r).await }))
        // Maintenance (etcd 3.4 maps /v3/maintenance/hash to Hash; HashKV has no path of its own)
        .route("/v3/maintenance/alarm", unary(|g, r| async move { maintenance(g).alarm(r).await }))
        .route("/v3/maintenance/status", unary(|g, r| async move { maintenance(g).status(r).await }))
        .route("/v3/maintenance/defragment", unary(|g, r| async move { maintenance(g).defragment(r).await }))
        .route("/v3/maintenance/hash", unary(|g, r| async move { maintenance(g).hash(r).await }))
        .route("/v3/maintenance/snapshot", server_stream(|g, r| async move { maintenance(g).snapshot(r).await }))
        .route("/v3/maintenance/transfer-leadership", unary(|g, r| async move { maintenance(g).move_leader(r).await }))
        // Auth
        .route("/v3/auth/enable", unary(|g, r| async move { auth(g).auth_enable(r).await }))
        .route("/v3/auth/disable", unary(|g, r| async move { auth(g).auth_disable(r).await }))
        .route("/v3/auth/status", unary(|g, r| async move { auth(g).auth_status(r).await }))
        .route("/v3/auth/authenticate", unary(|g, r| async move { auth(g).authenticate(r).await }))
        .route("/v3/auth/user/add", unary(|g, r| async move { auth(g).user_add(r).await }))
        .route("/v3/auth/user/get", unary(|g, r| async move { auth(g).user_get(r).await }))
        .route("/v3/auth/user/list", unary(|g, r| async move { auth(g).user_list(r).await }))
        .route("/v3/auth/user/delete", unary(|g, r| async move { auth(g).user_delete(r).await }))
        .route("/v3/auth/user/changepw", unary(|g, r| async move { auth(g).user_change_password(r).await }))
        .route("/v3/auth/user/grant", unary(|g, r| async move { auth(g).user_grant_role(r).await }))
        .route("/v3/auth/user/revoke", unary(|g, r| async move { auth(g).user_revoke_role(r).await }))
        .route("/v3/auth/role/add", unary(|g, r| async move { auth(g).role_add(r).await }))
        .route("/v3/auth/role/get", unary(|g, r| async move { auth(g).role_get(r).await }))
        .route("/v3/auth/role/list", unary(|g, r| async move { auth(g).role_list(r).await }))
        .route("/v3/auth/role/delete", unary(|g, r| async move { auth(g).role_delete(r).await }))
        .route("/v3/auth/role/grant", unary(|g, r| async move { auth(g).role_grant_permission(r).await }))
        .route("/v3/auth/role/revoke", unary(|g, r| async move { auth(g).role_revoke_permission(r).await }))
        // Lock and Election (etcd's v3lock and v3election gateways)
        .route("/v3/lock/lock", unary(|g, r| async move { lock(g).lock(r).await }))
        .route("/v3/lock/unlock", unary(|g, r| async move { lock(g).unlock(r).await }))
        .route("/v3/election/campaign", unary(|g, r| async move { election(g).campaign(r).await }))
        .route("/v3/election/proclaim", unary(|g, r| async move { election(g).proclaim(r).await }))
        .route("/v3/election/leader", unary(|g, r| async move { election(g).leader(r).await }))
        .route("/v3/election/observe", server_stream(|g, r| async move { election(g).observe(r).await }))
        .route("/v3/election/resign", unary(|g, r| async move { election(g).resign(r).await }))
        .with_state(gateway)
}

// Clients over the listener's own services. Answers may be as large as etcd's gateway allows
// (it sets `MaxCallRecvMsgSize(math.MaxInt32)`).

fn kv(grpc: Routes) -> KvClient<Routes> {
    KvClient::new(grpc).max_decoding_message_size(usize::MAX)
}

// The bidirectional calls return boxed futures: the compiler cannot prove an unboxed one `Send` in
// the handler (a higher-ranked lifetime limitation); boxing checks it here, where the types are known.

fn watch(grpc: Routes, requests: Request<ReceiverStream<WatchRequest>>) -> Answers<WatchResponse> {
    Box::pin(async move { WatchClient::new(grpc).max_decoding_message_size(usize::MAX).watch(requests).await })
}

fn lease_keep_alive(
    grpc: Routes,
    requests: Request<ReceiverStream<LeaseKeepAliveRequest>>,
) -> Answers<LeaseKeepAliveResponse> {
    Box::pin(async move { lease(grpc).lease_keep_alive(requests).await })
}

type Answers<T> = BoxFuture<'static, Result<tonic::Response<Streaming<T>>, Status>>;

fn lease(grpc: Routes) -> LeaseClient<Routes> {
    LeaseClient::new(grpc).max_decoding_message_size(usize::MAX)
}

fn cluster(grpc: Routes) -> ClusterClient<Routes> {
    ClusterClient::new(grpc).max_decoding_message_size(usize::MAX)
}

fn lock(grpc: Routes) -> LockClient<Routes> {
    LockClient::new(grpc).max_decoding_message_size(usize::MAX)
}

fn election(grpc: Routes) -> ElectionClient<Routes> {
    ElectionClient::new(grpc).max_decoding_message_size(usize::MAX)
}

fn maintenance(grpc: Routes) -> MaintenanceClient<Routes> {
    MaintenanceClient::new(grpc).max_decoding_message_size(usize::MAX)
}
