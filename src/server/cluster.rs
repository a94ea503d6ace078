//! The Cluster service: membership as etcd clients see it.

use std::sync::Arc;

use crate::node::Node;
use crate::proto::etcdserverpb::cluster_server::Cluster;

pub struct ClusterService {
    #[allow(dead_code)]
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> Self {
        ClusterService { node }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {}
