//! `keyward snapshot save FILE`: a member's backup through its Snapshot RPC, with etcdctl's client
//! flags. The stream (the database, then one 32-byte chunk holding its SHA-256) goes to `FILE.part`;
//! the digest is checked against what was received, the file synced, and only then renamed to FILE,
//! so FILE is never a partial or corrupt backup. The file is the one `etcdctl snapshot save` writes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::backup::SaveArgs;
use anyhow::{anyhow, bail, Context as _};
use sha2::{Digest, Sha256};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::{AuthenticateRequest, SnapshotRequest, SnapshotResponse};

pub(crate) fn run(args: SaveArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let size = runtime.block_on(save(&args))?;
    println!("Snapshot saved at {} ({size} bytes)", args.file.display());
    Ok(())
}

async fn save(args: &SaveArgs) -> anyhow::Result<u64> {
    let (url, channel) = dial(args)?;
    let mut request = tonic::Request::new(SnapshotRequest {});
    if let Some(token) = log_in(args, &channel, &url).await? {
        request.metadata_mut().insert("token", token);
    }
    let mut stream = MaintenanceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .snapshot(request)
        .await
        .map_err(|s| anyhow!("snapshot from {url}: {}", s.message()))?
        .into_inner();
    let part = part_path(&args.file);
    match receive(&mut stream, &part, &url).await {
        Ok(size) => {
            std::fs::rename(&part, &args.file)
                .with_context(|| format!("cannot rename {} to {}", part.display(), args.file.display()))?;
            if let Some(dir) = args.file.parent().filter(|p| !p.as_os_str().is_empty()) {
                crate::storage::data_dir::sync_dir(dir).with_context(|| format!("cannot sync {}", dir.display()))?;
            }
            Ok(size)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

/// The one endpoint's URL (https when a CA or certificate is given, as etcdctl) and a channel to it.
fn dial(args: &SaveArgs) -> anyhow::Result<(String, Channel)> {
    let endpoints: Vec<&String> = args.endpoints.iter().filter(|e| !e.is_empty()).collect();
    let [endpoint] = endpoints[..] else {
        bail!("--endpoints: snapshot must be requested to one selected node, not multiple {:?}", endpoints);
    };
    let url = if endpoint.contains("://") {
        endpoint.clone()
    } else if args.cacert.is_some() || args.cert.is_some() {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    };
    let tls = match (&args.cacert, &args.cert, &args.key) {
        (None, None, _) => None,
        (Some(ca), cert, key) => {
            let pair = match (cert, key) {
                (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
                (None, None) => None,
                _ => bail!("--cert and --key go together"),
            };
            Some(
                crate::frontend::tls::client::client_config(
                    ca,
                    pair,
                    ("--cacert", "--cert", "--key"),
                    &crate::frontend::tls::policy::TlsPolicy::default(),
                )
                .map_err(|e| anyhow!(e))?,
            )
        }
        (None, Some(_), _) => bail!("--cert needs --cacert (the CA that signs the server certificate)"),
    };
    let channel =
        crate::frontend::tls::client::lazy_channel(&url, tls.as_ref(), Duration::from_secs(args.dial_timeout))
            .map_err(|e| anyhow!("--endpoints: {e}"))?;
    Ok((url, channel))
}

/// With `--user`: a token from Authenticate, for the Snapshot call.
async fn log_in(args: &SaveArgs, channel: &Channel, url: &str) -> anyhow::Result<Option<AsciiMetadataValue>> {
    let Some(user) = &args.user else { return Ok(None) };
    let (name, password) = match (user.split_once(':'), &args.password) {
        (Some((name, password)), _) => (name.to_string(), password.to_string()),
        (None, Some(password)) => (user.clone(), password.clone()),
        (None, None) => bail!("--user {user}: give the password as --user NAME:PASSWORD or --password"),
    };
    let resp = AuthClient::new(channel.clone())
        .authenticate(AuthenticateRequest { name: name.clone(), password })
        .await
        .map_err(|s| anyhow!("authenticate as {name} at {url}: {}", s.message()))?;
    Ok(Some(AsciiMetadataValue::try_from(resp.into_inner().token).context("the server's token")?))
}

/// Writes the stream to `part` (created private) and checks its digest; the size of the database.
async fn receive(stream: &mut Streaming<SnapshotResponse>, part: &Path, url: &str) -> anyhow::Result<u64> {
    let mut out = std::io::BufWriter::new(
        crate::storage::data_dir::create_private_file(part)
            .with_context(|| format!("cannot create {}", part.display()))?,
    );
    let write = |e| anyhow!("cannot write {}: {e}", part.display());
    // The last chunk is the digest of the ones before: each chunk is hashed once the next arrives.
    let mut sha = Sha256::new();
    let mut pending: Option<Vec<u8>> = None;
    let mut size = 0u64;
    while let Some(chunk) = stream.message().await.map_err(|s| anyhow!("snapshot from {url}: {}", s.message()))? {
        if let Some(previous) = pending.replace(chunk.blob) {
            sha.update(&previous);
        }
        let blob = pending.as_deref().unwrap_or_default();
        out.write_all(blob).map_err(write)?;
        size += blob.len() as u64;
    }
    let digest = pending.unwrap_or_default();
    if digest.len() != 32 || sha.finalize()[..] != digest[..] {
        bail!(
            "snapshot from {url}: the stream's sha256 does not match its data (incomplete or corrupt); nothing saved"
        );
    }
    let file = out.into_inner().map_err(|e| write(e.into_error()))?;
    file.sync_all().map_err(write)?;
    Ok(size)
}

fn part_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}
