//! The Maintenance service: member status (`etcdctl endpoint status`), consistency hashes
//! (`endpoint hashkv`), alarms, defragmentation, backups (`snapshot save`) and leadership transfer.

use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::requester::requester;
use crate::identity::Requester;

use crate::apply::Applied;
use crate::error::EtcdError;
use crate::node::Node;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse, HashKvRequest, HashKvResponse,
    HashRequest, HashResponse, InternalRaftRequest, MoveLeaderRequest, MoveLeaderResponse, ResponseHeader,
    SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use crate::raft::state_machine::State;

/// The etcd version whose behaviour keyward implements, reported by `Status.version`, `/version` and
/// `etcd_server_version`. Clients branch on it: kube-apiserver turns on `RequestWatchProgress` (its
/// consistent reads from the watch cache) only from 3.4.31 or 3.5.13, the releases where etcd ordered
/// requested progress notifications with the stream's events (etcd #15695) and sent them for watchers
/// that had no events (etcd #17566), which keyward's watch stream does (`server/watch/stream.rs`).
pub(crate) const ETCD_API_VERSION: &str = "3.5.13";
/// Its major.minor, as etcd reports its cluster version (`etcd_cluster_version`; `/version` adds `.0`).
pub(crate) const ETCD_CLUSTER_VERSION: &str = "3.5";

/// Bytes per snapshot chunk, as etcd's `snapshotSendBufferSize`.
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// Chunks read ahead of the client.
const SNAPSHOT_QUEUE: usize = 4;

pub(crate) struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        MaintenanceService { node }
    }

    /// With auth on, an authenticated user (errors in etcd's maintenance style, as below). Returns the
    /// requester.
    async fn require_user<T>(&self, request: &Request<T>, op: &'static str) -> Result<Requester, Status> {
        let who = requester(&self.node, request).map_err(raw_auth_status)?;
        self.node.require_user(who.clone(), op).await.map_err(|e| raw_auth_status(e.into()))?;
        Ok(who)
    }

    /// With auth enabled, Defragment, Snapshot, Hash and HashKV are root's, as in etcd
    /// (`authMaintenanceServer`: `IsAdminPermitted`); so is Alarm (see `alarm`). Returns the requester.
    async fn require_admin<T>(&self, request: &Request<T>, op: &'static str) -> Result<Requester, Status> {
        let who = requester(&self.node, request).map_err(raw_auth_status)?;
        self.node.require_admin(who.clone(), op).await.map_err(|e| raw_auth_status(e.into()))?;
        Ok(who)
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// etcd's Alarm: GET lists the active alarms (a linearizable read of the replicated alarm table,
    /// `AlarmType::None` = all), ACTIVATE and DEACTIVATE go through raft (`apply/alarm.rs`). Responses carry
    /// no header, as etcd's. GET is open to every client, as in etcd (Status shows the same alarms).
    /// With auth enabled, raising and clearing are root's: etcd 3.4 lets any client, even an
    /// unauthenticated one, raise NOSPACE (the cluster turns read-only) or clear it. keyward raises
    /// only NOSPACE: it has no corruption check that would justify a CORRUPT alarm.
    async fn alarm(&self, request: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let action = AlarmAction::try_from(request.get_ref().action)
            .map_err(|_| EtcdError::Unsupported(format!("unknown alarm action {}", request.get_ref().action)))?;
        let who = match action {
            AlarmAction::Get => self.require_user(&request, "alarm").await?,
            AlarmAction::Activate | AlarmAction::Deactivate => self.require_admin(&request, "alarm").await?,
        };
        let req = request.into_inner();
        match action {
            AlarmAction::Get => {
                self.node.read_index().await?;
                let alarm = req.alarm;
                let alarms = self.node.read_state(move |state, txn| Ok(state.alarms.list(txn, alarm)?)).await?;
                return Ok(Response::new(AlarmResponse { header: None, alarms }));
            }
            AlarmAction::Activate if req.alarm != AlarmType::Nospace as i32 => {
                return Err(EtcdError::Unsupported(format!(
                    "keyward raises only NOSPACE alarms, not {}",
                    AlarmType::try_from(req.alarm).map_or_else(|_| req.alarm.to_string(), |t| t.as_str_name().into())
                ))
                .into());
            }
            AlarmAction::Activate | AlarmAction::Deactivate => {}
        }
        match self.node.propose(InternalRaftRequest { alarm: Some(Box::new(req)), ..Default::default() }, &who).await? {
            Applied::Alarm(resp) => Ok(Response::new(resp)),
            other => {
                tracing::error!(?other, "apply result does not match the proposal");
                Err(EtcdError::Internal.into())
            }
        }
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.require_user(&request, "status").await?;
        let metrics = self.node.raft.metrics().borrow().clone();
        let db_size = self.node.state().disk_size().unwrap_or(0) as i64;
        let leader = self.node.leader();
        // As etcd: "no leader", then each active alarm in Go's text form.
        let mut errors = Vec::new();
        if leader.is_none() {
            errors.push(EtcdError::NoLeader.to_string());
        }
        errors.extend(self.node.state().active_alarms().iter().map(crate::space::alarm::go_text));
        let mut resp = StatusResponse {
            version: ETCD_API_VERSION.to_string(),
            db_size,
            leader: leader.unwrap_or(0),
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: metrics.last_applied.map_or(0, |l| l.index),
            errors,
            // LMDB's pages in use (free pages, reused in place, are not counted).
            db_size_in_use: (self.node.space.in_use() as i64).min(db_size),
            ..Default::default()
        };
        self.node.fill(&mut resp.header);
        let rev = self.node.read(false, |view, _| Ok(view.rev)).await?;
        if let Some(h) = resp.header.as_mut() {
            h.revision = rev;
        }
        Ok(Response::new(resp))
    }

    /// etcd's Defragment rewrites its backend's file without the free pages. LMDB reuses freed pages in
    /// place but never shrinks its file: keyward replaces the kv environment with a compacting copy
    /// (`raft/state_machine/defrag.rs`). Writes wait meanwhile, as in etcd; reads wait only while the
    /// environments are swapped. A failure leaves the old environment serving.
    async fn defragment(&self, request: Request<DefragmentRequest>) -> Result<Response<DefragmentResponse>, Status> {
        self.require_admin(&request, "defragment").await?;
        tracing::info!("starting defragment");
        let done = self.node.defragment().await?;
        tracing::info!(
            before_bytes = done.before,
            after_bytes = done.after,
            took = ?done.took,
            "finished defragment"
        );
        // No header, as etcd 3.4 answers (clients assert it).
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// CRC-32C over every replicated table, auth included (see `State::hash_all`); the header carries
    /// the revision the hash was taken at.
    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.require_admin(&request, "hash").await?;
        let (hash, rev) =
            self.node.read_state(|state, txn| Ok((state.hash_all(txn)?, state.kv.view(txn)?.rev))).await?;
        Ok(Response::new(HashResponse { header: self.node.header(rev), hash }))
    }

    /// etcd's HashKV: CRC-32C over the key-value history up to the requested revision (0 = current);
    /// see `ReadView::hash_kv`. Not linearizable, as in etcd: it hashes what this member has applied.
    async fn hash_kv(&self, request: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        self.require_admin(&request, "hash_kv").await?;
        let requested = request.get_ref().revision;
        let (hashed, rev) = self.node.read(false, move |view, _| Ok((view.hash_kv(requested)?, view.rev))).await?;
        Ok(Response::new(HashKvResponse {
            header: self.node.header(rev),
            hash: hashed.hash,
            compact_revision: hashed.compact_rev,
        }))
    }

    /// The applied state as an etcd backend (a bbolt database, `backup/export/`), streamed in 32 KiB
    /// chunks, followed — as etcd does — by one last chunk holding the SHA-256 of everything sent
    /// before it. `remaining_bytes` counts the database bytes still to come (0 on the last database
    /// chunk and on the digest). `etcdctl snapshot status` and `restore` read it as an etcd backup.
    ///
    /// The database is written from one read transaction to a temp file under `<data-dir>/member/`
    /// that is unlinked as soon as it is created: the transaction ends when the file is written (a
    /// slow client does not keep LMDB from reusing pages), the open handle keeps the file readable
    /// while streaming, and its space is freed when the stream ends or the client goes away — a crash
    /// leaves nothing behind.
    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<BoxStream<SnapshotResponse>>, Status> {
        self.require_admin(&request, "snapshot").await?;
        // The state, not only its env: a defragment waits for the copy to end before it swaps.
        let state = self.node.state();
        let (file, total) =
            tokio::task::spawn_blocking(move || write_backend(&state)).await.map_err(|_| EtcdError::Internal)??;
        let header = self.node.header(0);
        let (tx, rx) = mpsc::channel(SNAPSHOT_QUEUE);
        tokio::task::spawn_blocking(move || send_snapshot(file, total, header, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// Transfers leadership to voter `target` (`node/transfer.rs`). As etcd, only the leader takes
    /// it (etcdctl sends it there); with auth on it is root's, as every membership operation.
    async fn move_leader(&self, request: Request<MoveLeaderRequest>) -> Result<Response<MoveLeaderResponse>, Status> {
        self.require_admin(&request, "move_leader").await?;
        self.node.move_leader(request.get_ref().target_id).await?;
        // No header, as etcd 3.4 answers (clients assert it).
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }
}

/// etcd's maintenance service returns its auth package's errors untranslated, so clients see them
/// with code Unknown and an `auth: ` prefix (e.g. `auth: user name is empty`), unlike every other
/// service ("etcdserver: user name is empty", InvalidArgument). `etcdctl defrag`, `endpoint hashkv` and
/// `snapshot save` print that text, so keyward mirrors it here.
/// To move into error.rs (e.g. `EtcdError::to_raw_auth_status`) so that no Status is built elsewhere.
fn raw_auth_status(status: Status) -> Status {
    let raw = [EtcdError::UserEmpty, EtcdError::UserNotFound, EtcdError::PermissionDenied, EtcdError::InvalidAuthToken];
    match raw.iter().find(|e| e.to_string() == status.message()) {
        Some(e) => Status::unknown(e.to_string().replacen("etcdserver: ", "auth: ", 1)),
        None => status,
    }
}

/// Where snapshot copies are written: `<data-dir>/member/`, next to the kv environment.
fn snapshot_dir(state: &State) -> PathBuf {
    let kv = state.dir();
    kv.parent().unwrap_or(kv).to_path_buf()
}

fn io_error(err: std::io::Error) -> EtcdError {
    EtcdError::from(heed::Error::Io(err))
}

/// Writes the state as an etcd backend into an anonymous (already unlinked) file; returns it rewound,
/// with its length (whole 4 KiB pages: a multiple of 512, as `etcdctl snapshot save` expects).
fn write_backend(state: &State) -> Result<(File, u64), EtcdError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = snapshot_dir(state);
    let path = dir.join(format!("snapshot-{}-{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    // Owner-only even for the moment before the unlink: it is a copy of every key and password hash.
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(crate::storage::data_dir::FILE_MODE)
        .open(&path)
        .map_err(io_error)?;
    remove_temp(&path);
    let start = Instant::now();
    let exported = crate::backup::export::write_etcd_backend(state, file).map_err(|e| match e {
        crate::backup::export::ExportError::Store(e) => e,
        crate::backup::export::ExportError::Write(crate::backup::export::bolt_writer::WriteError::Io(e)) => io_error(e),
        crate::backup::export::ExportError::Write(e) => {
            tracing::error!(error = %e, "cannot write the state as an etcd backend");
            EtcdError::Internal
        }
    })?;
    crate::metrics::BACKEND_SNAPSHOT_SECONDS.observe(start.elapsed().as_secs_f64());
    let mut file = exported.file;
    file.rewind().map_err(io_error)?;
    tracing::info!(
        total_bytes = exported.len,
        revision = exported.revision,
        took = ?start.elapsed(),
        "wrote the kv state as an etcd backend for a snapshot"
    );
    Ok((file, exported.len))
}

fn remove_temp(path: &Path) {
    if let Err(err) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %err, "cannot remove snapshot temp file");
    }
}

/// Streams `total` bytes of `file` in chunks, then their SHA-256. Stops (dropping the file) as soon as
/// the receiver is gone.
fn send_snapshot(
    mut file: File,
    total: u64,
    header: Option<ResponseHeader>,
    tx: mpsc::Sender<Result<SnapshotResponse, Status>>,
) {
    let start = Instant::now();
    tracing::info!(total_bytes = total, "sending database snapshot to client");
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; SNAPSHOT_CHUNK];
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(SNAPSHOT_CHUNK as u64) as usize;
        if let Err(err) = file.read_exact(&mut buf[..n]) {
            let _ = tx.blocking_send(Err(io_error(err).into()));
            return;
        }
        sent += n as u64;
        sha.update(&buf[..n]);
        let chunk = SnapshotResponse { header, remaining_bytes: total - sent, blob: buf[..n].to_vec() };
        if tx.blocking_send(Ok(chunk)).is_err() {
            tracing::info!(sent, total_bytes = total, "snapshot client went away");
            return;
        }
    }
    let digest = SnapshotResponse { header, remaining_bytes: 0, blob: sha.finalize().to_vec() };
    if tx.blocking_send(Ok(digest)).is_ok() {
        tracing::info!(total_bytes = total, took = ?start.elapsed(), "sent database snapshot to client");
    }
}
