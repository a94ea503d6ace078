//! The Election service (etcd's `v3election`, on `clientv3/concurrency`'s `Election`): a candidate
//! puts its value under `name/` with its lease and leads once every key under `name/` created before
//! its own is deleted; Proclaim and Resign act only while the leader key is the one created at the
//! leader's revision; Leader and Observe read the key created first. Every step runs as the caller
//! (`concurrency/`).

use std::pin::Pin;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::concurrency::caller::Caller;
use super::concurrency::cleanup::OnAbandon;
use super::concurrency::keys::{key_of_lease, prefix};
use super::concurrency::steps::{created_at, delete, first_created, get, put, ranged, Steps};
use crate::error::EtcdError;
use crate::proto::etcdserverpb::{ResponseHeader, TxnRequest};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::KeyValue;
use crate::proto::v3electionpb::election_server::Election;
use crate::proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ProclaimResponse,
    ResignRequest, ResignResponse,
};

pub(crate) struct ElectionService {
    /// The listener's KV, Lease and Watch services, which every step calls.
    grpc: Routes,
}

impl ElectionService {
    pub(crate) fn new(grpc: Routes) -> Self {
        ElectionService { grpc }
    }

    fn steps<T>(&self, request: &Request<T>) -> Steps {
        Steps::new(self.grpc.clone(), Caller::of(request))
    }
}

type Observed = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(&self, request: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        let steps = self.steps(&request);
        let req = request.into_inner();
        let lease = steps.session_lease(req.lease).await?;
        let prefix = prefix(&req.name);
        let key = key_of_lease(&prefix, lease);
        // Stand, or find this lease's standing candidacy.
        let stood = steps
            .txn(TxnRequest {
                compare: vec![created_at(&key, 0)],
                success: vec![put(&key, &req.value, lease)],
                failure: vec![get(&key)],
            })
            .await?;
        let mut revision = stood.header.as_ref().map_or(0, |header| header.revision);
        if !stood.succeeded {
            if let Some(standing) = ranged(&stood, 0).first() {
                revision = standing.create_revision;
                // Already a candidate with another value: announce this one, or give up.
                if standing.value != req.value {
                    if let Err(status) = proclaim(&steps, &key, revision, lease, &req.value).await {
                        resign_quietly(steps, key, revision).await;
                        return Err(status);
                    }
                }
            }
        }
        // Wait for every candidate ahead. A client that goes away resigns, as etcd's Campaign does on
        // a cancelled context; any other failure leaves the candidacy standing, as there.
        let abandoned = OnAbandon::new(resign_quietly(steps.clone(), key.clone(), revision).boxed());
        let waited = steps.wait_deletes(&prefix, revision - 1).await;
        abandoned.disarm();
        waited?;
        let leader = LeaderKey { name: req.name, key, rev: revision, lease };
        Ok(Response::new(CampaignResponse { header: stood.header, leader: Some(leader) }))
    }

    async fn proclaim(&self, request: Request<ProclaimRequest>) -> Result<Response<ProclaimResponse>, Status> {
        let steps = self.steps(&request);
        let req = request.into_inner();
        let leader = req.leader.ok_or(EtcdError::MissingLeaderKey)?;
        let lease = steps.session_lease(leader.lease).await?;
        let header = proclaim(&steps, &leader.key, leader.rev, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(&self, request: Request<LeaderRequest>) -> Result<Response<LeaderResponse>, Status> {
        let steps = self.steps(&request);
        let first = steps.range(first_created(&prefix(&request.into_inner().name))).await?;
        let kv = first.kvs.into_iter().next().ok_or(EtcdError::ElectionNoLeader)?;
        Ok(Response::new(LeaderResponse { header: first.header, kv: Some(kv) }))
    }

    async fn observe(&self, request: Request<LeaderRequest>) -> Result<Response<Observed>, Status> {
        let steps = self.steps(&request);
        let prefix = prefix(&request.into_inner().name);
        // One answer in flight: a client that does not read holds the observer, not a queue.
        let (sender, answers) = mpsc::channel(1);
        tokio::spawn(async move {
            tokio::select! {
                _ = sender.closed() => {}
                ended = observe(&steps, &prefix, &sender) => {
                    // As etcd's Observe: a failed step ends the stream without an error.
                    if let Err(status) = ended {
                        tracing::debug!(error = %status, "election observe ended");
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(answers).map(Ok))))
    }

    async fn resign(&self, request: Request<ResignRequest>) -> Result<Response<ResignResponse>, Status> {
        let steps = self.steps(&request);
        let leader = request.into_inner().leader.ok_or(EtcdError::MissingLeaderKey)?;
        // etcd's session: a lease of 0 is granted one, though resigning does not use it.
        steps.session_lease(leader.lease).await?;
        let header = resign(&steps, &leader.key, leader.rev).await?;
        Ok(Response::new(ResignResponse { header }))
    }
}

/// Puts `value` as the leader's, if `key` is still the one created at `revision`.
async fn proclaim(
    steps: &Steps,
    key: &[u8],
    revision: i64,
    lease: i64,
    value: &[u8],
) -> Result<Option<ResponseHeader>, Status> {
    let proclaimed = steps
        .txn(TxnRequest {
            compare: vec![created_at(key, revision)],
            success: vec![put(key, value, lease)],
            failure: Vec::new(),
        })
        .await?;
    if !proclaimed.succeeded {
        return Err(EtcdError::ElectionNotLeader.into());
    }
    Ok(proclaimed.header)
}

/// Deletes `key` if it is still the one created at `revision`.
async fn resign(steps: &Steps, key: &[u8], revision: i64) -> Result<Option<ResponseHeader>, Status> {
    let resigned = steps
        .txn(TxnRequest { compare: vec![created_at(key, revision)], success: vec![delete(key)], failure: Vec::new() })
        .await?;
    Ok(resigned.header)
}

/// `resign` on the way out of a campaign that failed: its error is the campaign's to report.
async fn resign_quietly(steps: Steps, key: Vec<u8>, revision: i64) {
    if let Err(status) = resign(&steps, &key, revision).await {
        tracing::debug!(error = %status, "election: resigning a failed campaign failed");
    }
}

/// Sends every leader's value under `prefix` as it is announced (etcd's `Election.observe`): the
/// leader now (or, with none, the first key put), then each put of its key until it is deleted, then
/// the next leader. Ends when the client goes (`Ok`) or a step fails.
async fn observe(steps: &Steps, prefix: &[u8], answers: &mpsc::Sender<LeaderResponse>) -> Result<(), Status> {
    loop {
        let Some((header, kv)) = current_leader(steps, prefix).await? else { return Ok(()) };
        let from = header.as_ref().map_or(0, |header| header.revision) + 1;
        let key = kv.key.clone();
        if answers.send(LeaderResponse { header, kv: Some(kv) }).await.is_err() {
            return Ok(());
        }
        let mut watch = steps.watch(&key, Vec::new(), from).await?;
        'leading: loop {
            let Some(answer) = watch.next().await else { return Ok(()) };
            let answer = answer?;
            for event in answer.events {
                if event.r#type() == EventType::Delete {
                    break 'leading;
                }
                if answers.send(LeaderResponse { header: answer.header, kv: event.kv }).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// The leader under `prefix` and the header to announce it with: the key created first, or, with
/// none, the first key put after (its header's revision that put's). `None`: the watch ended.
async fn current_leader(steps: &Steps, prefix: &[u8]) -> Result<Option<(Option<ResponseHeader>, KeyValue)>, Status> {
    let first = steps.range(first_created(prefix)).await?;
    if let Some(kv) = first.kvs.into_iter().next() {
        return Ok(Some((first.header, kv)));
    }
    let from = first.header.as_ref().map_or(0, |header| header.revision);
    let mut watch = steps.watch_prefix(prefix, from).await?;
    while let Some(answer) = watch.next().await {
        let answer = answer?;
        let put = answer.events.into_iter().find(|event| event.r#type() == EventType::Put).and_then(|e| e.kv);
        if let Some(kv) = put {
            let mut header = answer.header;
            if let Some(header) = header.as_mut() {
                header.revision = kv.mod_revision;
            }
            return Ok(Some((header, kv)));
        }
    }
    Ok(None)
}
