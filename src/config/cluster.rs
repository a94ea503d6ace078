//! The bootstrap flags: whether this member starts a new cluster or joins one
//! (`--initial-cluster-state`), the initial members and their peer URLs (`--initial-cluster`, checked
//! against this member's `--name` and `--initial-advertise-peer-urls`), and raft's timing
//! (`--heartbeat-interval`, `--election-timeout`) by etcd's rules.

use super::error::{invalid, ConfigError};
use super::listeners::parse_url;
use crate::cli::member::ServeArgs;

/// `--initial-cluster-state`: bootstrap a new cluster from `--initial-cluster`, or join a running one
/// that has already added this member (`etcdctl member add`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// `--initial-cluster-state`.
pub(super) fn cluster_state(flag: &str) -> Result<ClusterState, ConfigError> {
    match flag {
        "new" => Ok(ClusterState::New),
        "existing" => Ok(ClusterState::Existing),
        other => Err(invalid(format!("invalid --initial-cluster-state {other:?} (want \"new\" or \"existing\")"))),
    }
}

/// `--heartbeat-interval` and `--election-timeout`, in milliseconds.
pub(super) fn check_raft_timing(heartbeat_interval: u64, election_timeout: u64) -> Result<(), ConfigError> {
    if heartbeat_interval == 0 {
        return Err(invalid("--heartbeat-interval must be at least 1 ms"));
    }
    // etcd's rule: an election timeout of at least 5 heartbeats and at most 50 s.
    if election_timeout < 5 * heartbeat_interval {
        return Err(invalid(format!(
            "--election-timeout[{election_timeout}ms] should be at least as 5 times as --heartbeat-interval[{heartbeat_interval}ms]"
        )));
    }
    if election_timeout > 50_000 {
        return Err(invalid(format!(
            "--election-timeout[{election_timeout}ms] is too long, and should be set less than 50000ms"
        )));
    }
    Ok(())
}

/// `--initial-cluster` (default: NAME=INITIAL-ADVERTISE-PEER-URLS): every initial member's name and
/// peer URLs, in the order given; no URL twice, and this member's entry as it advertises itself.
pub(super) fn initial_members(args: &ServeArgs) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
    let initial_cluster = args.initial_cluster.clone().unwrap_or_else(|| {
        format!("{}={}", args.name, args.initial_advertise_peer_urls.join(&format!(",{}=", args.name)))
    });
    let mut members = Vec::<(String, Vec<String>)>::new();
    for entry in initial_cluster.split(',').filter(|e| !e.is_empty()) {
        let (name, url) = entry
            .split_once('=')
            .ok_or_else(|| invalid(format!("--initial-cluster entry {entry:?} is not NAME=URL")))?;
        parse_url(url)?;
        match members.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url.to_string()),
            None => members.push((name.to_string(), vec![url.to_string()])),
        }
    }
    let mut seen = std::collections::BTreeMap::new();
    for (name, urls) in &members {
        for url in urls {
            if let Some(other) = seen.insert(url.as_str(), name.as_str()) {
                return Err(invalid(format!("--initial-cluster has duplicate url {url} ({other} and {name})")));
            }
        }
    }
    let Some((_, own)) = members.iter().find(|(n, _)| n == &args.name) else {
        return Err(invalid(format!("--initial-cluster has no member named {:?} (this member's --name)", args.name)));
    };
    let mut own_sorted = own.clone();
    let mut advertised = args.initial_advertise_peer_urls.clone();
    own_sorted.sort();
    advertised.sort();
    if own_sorted != advertised {
        return Err(invalid(format!(
            "--initial-cluster has {}={} but --initial-advertise-peer-urls is {}",
            args.name,
            own.join(","),
            args.initial_advertise_peer_urls.join(",")
        )));
    }
    Ok(members)
}
