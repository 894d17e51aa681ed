//! The failover actor (outline: its handlers answer `NotRunning` until the election is written).

use actix::prelude::*;
use supervisor_actor::Node;

use crate::config::FailoverConfig;
use crate::error::FailoverError;
use crate::messages::{
    Failover, GetClusterView, GetHistory, GetLocalHealth, Pause, Resume, Switchover,
    SwitchoverReport,
};
use crate::view::{ClusterView, LocalHealth, TermRecord};

/// Keeps one node's membership and leadership in etcd and tells its supervisor what to do.
pub struct FailoverActor {
    #[allow(dead_code)]
    config: FailoverConfig,
    #[allow(dead_code)]
    node: Node,
}

impl FailoverActor {
    /// Starts the actor for `node`, whose fence must be [`supervisor_actor::Fence::closed`]
    /// (the node acknowledges nothing until this actor has won the leader key).
    pub fn start(config: FailoverConfig, node: Node) -> Result<Addr<FailoverActor>, FailoverError> {
        Ok(Actor::start(FailoverActor { config, node }))
    }
}

impl Actor for FailoverActor {
    type Context = Context<Self>;
}

impl Handler<GetClusterView> for FailoverActor {
    type Result = Result<ClusterView, FailoverError>;
    fn handle(&mut self, _: GetClusterView, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}

impl Handler<GetLocalHealth> for FailoverActor {
    type Result = MessageResult<GetLocalHealth>;
    fn handle(&mut self, _: GetLocalHealth, _: &mut Context<Self>) -> Self::Result {
        MessageResult(LocalHealth {
            leader_with_live_lease: false,
            streaming: false,
            lag_bytes: None,
            term: None,
        })
    }
}

impl Handler<GetHistory> for FailoverActor {
    type Result = Result<Vec<TermRecord>, FailoverError>;
    fn handle(&mut self, _: GetHistory, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}

impl Handler<Switchover> for FailoverActor {
    type Result = Result<SwitchoverReport, FailoverError>;
    fn handle(&mut self, _: Switchover, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}

impl Handler<Failover> for FailoverActor {
    type Result = Result<SwitchoverReport, FailoverError>;
    fn handle(&mut self, _: Failover, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}

impl Handler<Pause> for FailoverActor {
    type Result = Result<(), FailoverError>;
    fn handle(&mut self, _: Pause, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}

impl Handler<Resume> for FailoverActor {
    type Result = Result<(), FailoverError>;
    fn handle(&mut self, _: Resume, _: &mut Context<Self>) -> Self::Result {
        Err(FailoverError::NotRunning)
    }
}
