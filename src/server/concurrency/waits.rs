//! Waiting, over the listener's Watch service as the caller: for the keys ahead in line to be
//! deleted (etcd's `waitDeletes`), and the watches Observe follows. A wait is a watch stream and the
//! task awaiting it: no thread, no raft slot, and dropping it (the client went away) cancels the watch.

use futures::StreamExt;
use tonic::{Status, Streaming};

use super::keys::prefix_end;
use super::steps::{last_created_by, untranslated, Steps};
use crate::error::EtcdError;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use crate::proto::mvccpb::event::EventType;

/// A watch of one caller: its answers after the one that created it.
pub(crate) struct Watch {
    answers: Streaming<WatchResponse>,
}

impl Watch {
    /// The next answer with events. `None`: the watch ended (the member is shutting down), as etcd's
    /// closed watch channel. An error: the watch was canceled (compacted away, permission revoked).
    pub(crate) async fn next(&mut self) -> Option<Result<WatchResponse, Status>> {
        loop {
            let answer = match self.answers.next().await? {
                Ok(answer) => answer,
                Err(status) => return Some(Err(untranslated(status))),
            };
            if let Some(refused) = canceled(&answer) {
                return Some(Err(refused));
            }
            if !answer.events.is_empty() {
                return Some(Ok(answer));
            }
        }
    }
}

/// Why a watch answer cancels the watch, as etcd's client reports it: compacted, or the reason.
fn canceled(answer: &WatchResponse) -> Option<Status> {
    if answer.compact_revision != 0 {
        return Some(EtcdError::Compacted.into());
    }
    answer.canceled.then(|| Status::unknown(answer.cancel_reason.clone()))
}

impl Steps {
    /// Opens a watch of `key` (with `range_end`) from `start_revision`, waiting for its creation.
    pub(crate) async fn watch(&self, key: &[u8], range_end: Vec<u8>, start_revision: i64) -> Result<Watch, Status> {
        let create = WatchCreateRequest { key: key.to_vec(), range_end, start_revision, ..Default::default() };
        let create = WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) };
        // The request side stays open: a watch stream whose client half-closed may end.
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        let mut client = WatchClient::new(self.grpc()).max_decoding_message_size(usize::MAX);
        let mut answers = client.watch(self.caller().request(requests)).await.map_err(untranslated)?.into_inner();
        match answers.next().await {
            Some(Ok(created)) => match canceled(&created) {
                Some(refused) => Err(refused),
                None => Ok(Watch { answers }),
            },
            Some(Err(status)) => Err(untranslated(status)),
            None => Err(lost()),
        }
    }

    /// Opens a watch of every key under `prefix` from `start_revision`.
    pub(crate) async fn watch_prefix(&self, prefix: &[u8], start_revision: i64) -> Result<Watch, Status> {
        self.watch(prefix, prefix_end(prefix), start_revision).await
    }

    /// Waits until no key under `prefix` created at or before `max_create_revision` remains, and
    /// answers the header of the read that found none (etcd's `waitDeletes`): one watch at a time,
    /// on the key just ahead in line.
    pub(crate) async fn wait_deletes(
        &self,
        prefix: &[u8],
        max_create_revision: i64,
    ) -> Result<Option<ResponseHeader>, Status> {
        loop {
            let ahead = self.range(last_created_by(prefix, max_create_revision)).await?;
            let Some(last) = ahead.kvs.first() else { return Ok(ahead.header) };
            let revision = ahead.header.as_ref().map_or(0, |header| header.revision);
            if let Err(ended) = self.wait_delete(&last.key, revision).await {
                // keyward cancels a watch whose caller lost read access; etcd's watch goes on and its
                // next read is refused. Read again first, so that the caller gets that refusal.
                self.range(last_created_by(prefix, max_create_revision)).await?;
                return Err(ended);
            }
        }
    }

    /// Waits for a deletion of `key` at or after `revision`.
    async fn wait_delete(&self, key: &[u8], revision: i64) -> Result<(), Status> {
        let mut watch = self.watch(key, Vec::new(), revision).await?;
        while let Some(answer) = watch.next().await {
            if answer?.events.iter().any(|event| event.r#type() == EventType::Delete) {
                return Ok(());
            }
        }
        Err(lost())
    }
}

/// A watch that ended before the answer waited for.
fn lost() -> Status {
    EtcdError::LostWatcher.into()
}
