//! How a member finds its place: `--initial-cluster-state new` or `existing`, as etcd.
//!
//! - **new**: every member computes every initial member's id from `--initial-cluster` and the token
//!   (`ids.rs`), and initializes raft with that same membership; whichever members start, they agree.
//! - **existing**: the member was added by `etcdctl member add` on a running cluster. It asks the
//!   members named in `--initial-cluster` for the membership, finds itself by its peer URLs and takes
//!   the cluster's id; it does not initialize raft, the leader replicates the log (or a snapshot) to it.
//!
//! Either way the ids are stored in the data dir the first time; a restarted member uses the stored
//! ones and ignores the bootstrap flags, as etcd does.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ids;
use super::peers::Peers;
use crate::config::Config;
use crate::proto::keywardpb::MembershipRequest;
use crate::raft::member::MemberNode;
use crate::raft::NodeId;

/// How long a joining member keeps asking the running members before it gives up.
const JOIN_DEADLINE: Duration = Duration::from_secs(30);

/// A new cluster's initial membership, and this member's id and the cluster id.
pub(crate) struct NewCluster {
    pub member_id: NodeId,
    pub cluster_id: u64,
    pub members: BTreeMap<NodeId, MemberNode>,
}

pub(crate) fn new_cluster(config: &Config) -> NewCluster {
    new_cluster_of(&config.initial_cluster, &config.peer_urls, &config.cluster_token)
}

/// `new_cluster` from the three flags it reads: `--initial-cluster` (name and peer URLs of each
/// member), this member's `--initial-advertise-peer-urls` and `--initial-cluster-token`. `keyward
/// snapshot restore` and `keyward migrate` derive a restored member's ids with it.
pub(crate) fn new_cluster_of(
    initial_cluster: &[(String, Vec<String>)],
    peer_urls: &[String],
    token: &str,
) -> NewCluster {
    let members: BTreeMap<NodeId, MemberNode> = initial_cluster
        .iter()
        .map(|(name, urls)| (ids::member_id(urls, token), MemberNode::initial(name.clone(), urls.clone())))
        .collect();
    let ids: Vec<NodeId> = members.keys().copied().collect();
    NewCluster { member_id: ids::member_id(peer_urls, token), cluster_id: ids::cluster_id(&ids, token), members }
}

/// Joins a running cluster (`--initial-cluster-state existing`): `(member_id, cluster_id)` as the
/// running members know them.
pub(crate) async fn join(peers: &Peers, config: &Config) -> anyhow::Result<(NodeId, u64)> {
    let others: Vec<&String> =
        config.initial_cluster.iter().filter(|(name, _)| *name != config.name).flat_map(|(_, urls)| urls).collect();
    if others.is_empty() {
        anyhow::bail!("--initial-cluster-state=existing needs the running members' peer URLs in --initial-cluster");
    }
    let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
    let mut mine = config.peer_urls.clone();
    mine.sort();
    loop {
        let mut errors = Vec::new();
        for url in &others {
            let answer = match peers.client(url) {
                Ok(mut client) => {
                    client.membership(peers.request(MembershipRequest {}, Some(Duration::from_secs(2)))).await
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    let me = answer.members.iter().find(|m| {
                        let mut urls = m.peer_ur_ls.clone();
                        urls.sort();
                        urls == mine
                    });
                    return match me {
                        Some(me) => Ok((me.id, answer.cluster_id)),
                        None => Err(anyhow::anyhow!(
                            "member with peer URLs {} has not been added to cluster {:x} (add it first: etcdctl member add {} --peer-urls={})",
                            config.peer_urls.join(","),
                            answer.cluster_id,
                            config.name,
                            config.peer_urls.join(",")
                        )),
                    };
                }
                Err(status) => errors.push(format!("{url}: {}", status.message())),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("cannot fetch cluster info from peer urls: {}", errors.join("; "));
        }
        tracing::info!(errors = %errors.join("; "), "waiting for a running member to answer");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
