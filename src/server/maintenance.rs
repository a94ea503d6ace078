//! The Maintenance service: member status for `etcdctl endpoint status`.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{StatusRequest, StatusResponse};

/// The etcd API version keyward speaks.
pub const ETCD_API_VERSION: &str = "3.4.0";

pub struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    pub fn new(node: Arc<Node>) -> Self {
        MaintenanceService { node }
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let env = &self.node.state().env;
        let db_size = env.real_disk_size().unwrap_or(0) as i64;
        let info = env.info();
        let in_use = ((info.last_page_number as u64 + 1) * self.node.state().page_size()) as i64;
        let mut resp = StatusResponse {
            version: ETCD_API_VERSION.to_string(),
            db_size,
            leader: metrics.current_leader.unwrap_or(0),
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: metrics.last_applied.map_or(0, |l| l.index),
            db_size_in_use: in_use.min(db_size),
            ..Default::default()
        };
        self.node.fill(&mut resp.header);
        let rev = self.node.read(false, |view| Ok(view.rev)).await?;
        if let Some(h) = resp.header.as_mut() {
            h.revision = rev;
        }
        Ok(Response::new(resp))
    }
}
