//! `--idle-watchers`: watchers opened before a workload's load and kept open, on keys nobody writes,
//! to measure what many idle watchers cost other clients (a put to an unwatched key should not pay
//! for every watcher).

use std::sync::Arc;

use anyhow::{anyhow, bail};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::Request;

use crate::args::BenchArgs;
use crate::conn::describe;
use crate::conn::Conn;
use keyward::proto::etcdserverpb::watch_client::WatchClient;
use keyward::proto::etcdserverpb::{watch_request, WatchCreateRequest, WatchRequest};

/// The open streams; dropping it closes them.
pub(crate) struct IdleWatchers {
    readers: Vec<JoinHandle<()>>,
}

impl Drop for IdleWatchers {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
    }
}

/// Opens `--idle-watchers` single-key watchers over `--idle-watch-streams` streams and waits until
/// every one is created.
pub(crate) async fn open(args: &BenchArgs, conns: &[Arc<Conn>]) -> anyhow::Result<IdleWatchers> {
    let mut idle = IdleWatchers { readers: Vec::new() };
    if args.idle_watchers == 0 {
        return Ok(idle);
    }
    let streams = args.idle_watch_streams.min(args.idle_watchers);
    for s in 0..streams {
        let conn = &conns[s % conns.len()];
        let watchers: Vec<usize> = (s..args.idle_watchers).step_by(streams).collect();
        let (tx, rx) = tokio::sync::mpsc::channel::<WatchRequest>(watchers.len() + 1);
        for i in &watchers {
            let create = WatchCreateRequest { key: format!("idle-watch/{i:06}").into_bytes(), ..Default::default() };
            tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) })
                .await
                .map_err(|_| anyhow!("watch request channel closed"))?;
        }
        let mut request = Request::new(ReceiverStream::new(rx));
        conn.attach(request.metadata_mut());
        let inbound = WatchClient::new(conn.channel.clone())
            .watch(request)
            .await
            .map_err(|status| anyhow!("idle watch stream {s}: {}", describe(&status)))?
            .into_inner();
        // One stream at a time: its watchers are all created before the next stream opens.
        let (count, mut inbound) = (watchers.len(), inbound);
        let mut created = 0;
        while created < count {
            match inbound.next().await {
                Some(Ok(response)) if response.canceled => {
                    bail!("idle watch on stream {s} canceled: {}", response.cancel_reason)
                }
                Some(Ok(response)) if response.created => created += 1,
                Some(Ok(_)) => {}
                Some(Err(status)) => bail!("idle watch stream {s}: {}", describe(&status)),
                None => bail!("idle watch stream {s} closed before its watchers were created"),
            }
        }
        idle.readers.push(tokio::spawn(async move {
            let _keep_open = tx;
            while let Some(Ok(_)) = inbound.next().await {}
        }));
    }
    eprintln!("keyward-bench: {} idle watchers open on {streams} streams", args.idle_watchers);
    Ok(idle)
}
