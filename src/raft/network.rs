//! Raft peer transport.
//!
//! keyward runs single-member clusters for now (`keyward serve` refuses a multi-member
//! `--initial-cluster`), so a member never has a peer to reach. Any attempt reports the peer as
//! unreachable with the reason, rather than pretending to deliver.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;

use super::{NodeId, TypeConfig};

#[derive(Clone, Default)]
pub struct PeerNetwork;

pub struct NoPeer;

fn unreachable<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
        "peer networking is not supported yet: keyward runs single-member clusters",
    )))
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = NoPeer;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeer {
        NoPeer
    }
}

impl RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }
}
