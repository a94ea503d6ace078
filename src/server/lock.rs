//! The Lock service (etcd's `v3lock`, on `clientv3/concurrency`'s `Mutex`): Lock puts a key under
//! `name/` with the caller's lease, unless the lease already has one, and waits until every key
//! under `name/` created before it is deleted; that key holds the lock until Unlock deletes it or
//! its lease ends. Every step runs as the caller (`concurrency/`).

use futures::FutureExt;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::concurrency::caller::Caller;
use super::concurrency::cleanup::OnAbandon;
use super::concurrency::keys::{key_of_lease, prefix};
use super::concurrency::steps::{created_at, first_created, get, put, ranged, read, Steps};
use crate::proto::etcdserverpb::TxnRequest;
use crate::proto::v3lockpb::lock_server::Lock;
use crate::proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};

pub(crate) struct LockService {
    /// The listener's KV, Lease and Watch services, which every step calls.
    grpc: Routes,
}

impl LockService {
    pub(crate) fn new(grpc: Routes) -> Self {
        LockService { grpc }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let steps = Steps::new(self.grpc.clone(), Caller::of(&request));
        let req = request.into_inner();
        let lease = steps.session_lease(req.lease).await?;
        let prefix = prefix(&req.name);
        let key = key_of_lease(&prefix, lease);
        // Join the line, or find the key this lease already holds it with; and see who is first.
        let getting_owner = read(first_created(&prefix));
        let joined = steps
            .txn(TxnRequest {
                compare: vec![created_at(&key, 0)],
                success: vec![put(&key, b"", lease), getting_owner.clone()],
                failure: vec![get(&key), getting_owner],
            })
            .await?;
        let mut revision = joined.header.as_ref().map_or(0, |header| header.revision);
        if !joined.succeeded {
            revision = ranged(&joined, 0).first().map_or(revision, |existing| existing.create_revision);
        }
        let owner = ranged(&joined, 1).first().map(|owner| owner.create_revision);
        if owner.is_none_or(|owner| owner == revision) {
            return Ok(Response::new(LockResponse { header: joined.header, key }));
        }
        // In line: wait for everyone ahead. Given up (the client went away, or the wait failed), the
        // key leaves the line, as etcd's Mutex does.
        let abandoned = OnAbandon::new(leave_line(steps.clone(), key.clone()).boxed());
        let waited = steps.wait_deletes(&prefix, revision - 1).await;
        abandoned.disarm();
        match waited {
            Ok(header) => Ok(Response::new(LockResponse { header, key })),
            Err(status) => {
                leave_line(steps, key).await;
                Err(status)
            }
        }
    }

    async fn unlock(&self, request: Request<UnlockRequest>) -> Result<Response<UnlockResponse>, Status> {
        let steps = Steps::new(self.grpc.clone(), Caller::of(&request));
        let deleted = steps.delete(request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse { header: deleted.header }))
    }
}

/// Deletes a waiter's key that will not hold the lock.
async fn leave_line(steps: Steps, key: Vec<u8>) {
    if let Err(status) = steps.delete(key).await {
        tracing::debug!(error = %status, "lock: removing the key of a waiter that gave up failed");
    }
}
