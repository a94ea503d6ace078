//! Helpers for `benches/compare.sh`: `setup-auth` prepares users, roles and grants on a server whose
//! auth is still disabled (the same RPCs for keyward and etcd), and `bcrypt` measures how many bcrypt
//! verifications this machine does per second at a cost, the ceiling for Authenticate throughput.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, Context as _};
use tonic::transport::Channel;
use tonic::Status;

use crate::args::{BenchArgs, NewUser};
use crate::conn::connect_all;
use crate::conn::describe;
use crate::report::{Recorder, Summary};
use crate::workloads::{prefix_range, Budget};
use keyward::proto::authpb::{permission, Permission};
use keyward::proto::etcdserverpb::auth_client::AuthClient;
use keyward::proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
};

/// Treats "already exists" as success, so setup can be re-run.
fn tolerate_existing<T>(result: Result<T, Status>) -> Result<(), Status> {
    match result {
        Ok(_) => Ok(()),
        Err(status) if status.message().contains("already exists") => Ok(()),
        Err(status) => Err(status),
    }
}

pub(crate) async fn setup_auth(
    args: &BenchArgs,
    root_password: &str,
    new_users: &[NewUser],
    enable: bool,
) -> anyhow::Result<()> {
    let conns = connect_all(args, false).await?;
    let mut auth = AuthClient::new(conns[0].channel.clone());
    let started = Instant::now();
    let fail = |what: String| move |s: Status| anyhow!("{what}: {}", describe(&s));
    tolerate_existing(
        auth.user_add(AuthUserAddRequest { name: "root".into(), password: root_password.into(), ..Default::default() })
            .await,
    )
    .map_err(fail("user add root".into()))?;
    // etcd treats the root role as built in; adding it may be refused or already done.
    let _ = auth.role_add(AuthRoleAddRequest { name: "root".into() }).await;
    auth.user_grant_role(AuthUserGrantRoleRequest { user: "root".into(), role: "root".into() })
        .await
        .map_err(fail("grant role root to root".into()))?;
    let (key, range_end) = prefix_range(args.prefix.as_bytes());
    for user in new_users {
        let role = format!("{}-role", user.name);
        tolerate_existing(
            auth.user_add(AuthUserAddRequest {
                name: user.name.clone(),
                password: user.password.clone(),
                ..Default::default()
            })
            .await,
        )
        .map_err(fail(format!("user add {}", user.name)))?;
        tolerate_existing(auth.role_add(AuthRoleAddRequest { name: role.clone() }).await)
            .map_err(fail(format!("role add {role}")))?;
        auth.role_grant_permission(grant(&role, key.clone(), range_end.clone()))
            .await
            .map_err(fail(format!("grant {:?} to {role}", args.prefix)))?;
        let grants_started = Instant::now();
        extra_grants(args, &conns.iter().map(|c| c.channel.clone()).collect::<Vec<_>>(), user, &role).await?;
        if user.extra_grants > 0 {
            eprintln!(
                "granted {} single-key permissions to {role} in {:.1} s",
                user.extra_grants,
                grants_started.elapsed().as_secs_f64()
            );
        }
        auth.user_grant_role(AuthUserGrantRoleRequest { user: user.name.clone(), role: role.clone() })
            .await
            .map_err(fail(format!("grant role {role} to {}", user.name)))?;
    }
    if enable {
        auth.auth_enable(AuthEnableRequest {}).await.map_err(fail("auth enable".into()))?;
    }
    eprintln!(
        "auth setup done in {:.1} s: root{}{}",
        started.elapsed().as_secs_f64(),
        new_users.iter().map(|u| format!(", {} (+{} grants)", u.name, u.extra_grants)).collect::<String>(),
        if enable { ", auth enabled" } else { "" }
    );
    Ok(())
}

fn grant(role: &str, key: Vec<u8>, range_end: Vec<u8>) -> AuthRoleGrantPermissionRequest {
    AuthRoleGrantPermissionRequest {
        name: role.to_string(),
        perm: Some(Permission { perm_type: permission::Type::Readwrite as i32, key, range_end }),
    }
}

/// `kw-perm/NAME/00000`... single-key readwrite grants, sent by `--clients` concurrent clients.
async fn extra_grants(args: &BenchArgs, channels: &[Channel], user: &NewUser, role: &str) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>> = Vec::new();
    for i in 0..args.clients.min(user.extra_grants) {
        let mut auth = AuthClient::new(channels[i % channels.len()].clone());
        let (next, role, name, n) = (next.clone(), role.to_string(), user.name.clone(), user.extra_grants);
        tasks.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= n {
                    return Ok(());
                }
                let key = format!("kw-perm/{name}/{k:05}").into_bytes();
                auth.role_grant_permission(grant(&role, key, Vec::new()))
                    .await
                    .map_err(|s| anyhow!("grant {k} to {role}: {}", describe(&s)))?;
            }
        }));
    }
    for task in tasks {
        task.await.context("grant task")??;
    }
    Ok(())
}

/// bcrypt verifications per second on `--clients` OS threads, against one hash made at `cost`.
pub(crate) fn bcrypt(args: &BenchArgs, cost: u32) -> anyhow::Result<Summary> {
    const PASSWORD: &str = "keyward-bench-password";
    let hash = bcrypt::hash(PASSWORD, cost).context("bcrypt hash")?;
    let total = match (args.total, args.duration) {
        (Some(total), _) => Some(total),
        (None, Some(_)) => None,
        (None, None) => Some(20 * args.clients as u64),
    };
    let start = Instant::now();
    let budget = Budget { total, issued: AtomicU64::new(0), deadline: args.duration.map(|d| start + d) };
    let merged = Mutex::new(Recorder::default());
    std::thread::scope(|scope| {
        for _ in 0..args.clients {
            scope.spawn(|| {
                let mut recorder = Recorder::default();
                while budget.take().is_some() {
                    let t = Instant::now();
                    match bcrypt::verify(PASSWORD, &hash) {
                        Ok(true) => recorder.ok(t.elapsed()),
                        Ok(false) => recorder.error("bcrypt verify: mismatch".into()),
                        Err(e) => recorder.error(format!("bcrypt verify: {e}")),
                    }
                }
                merged.lock().unwrap_or_else(|e| e.into_inner()).merge(recorder);
            });
        }
    });
    let elapsed = start.elapsed();
    let mut summary = Summary::new(&format!("bcrypt (cost {cost}, {} threads)", args.clients), args, "hashes");
    summary.endpoints = vec!["local".into()];
    summary.conns = 0;
    summary.record(merged.into_inner().unwrap_or_else(|e| e.into_inner()), elapsed);
    summary.extra.push(("available_parallelism", std::thread::available_parallelism().map_or(1, |n| n.get()) as f64));
    Ok(summary)
}
