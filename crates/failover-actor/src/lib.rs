//! failover-actor: automatic failover of walserver nodes on etcd (story to be written).

mod actor;
mod admin;
mod config;
mod error;
pub mod keys;
pub mod machine;
mod messages;
mod peers;
mod store;
mod view;

pub use actor::FailoverActor;
pub use config::{FailoverConfig, SynchronousMode, DEFAULT_MAXIMUM_LAG_ON_FAILOVER, DEFAULT_TTL};
pub use error::FailoverError;
pub use messages::{
    Failover, GetClusterView, GetHistory, GetLocalHealth, Leadership, Pause, Resume, StopFailover,
    SubscribeLeadership, Switchover, SwitchoverReport,
};
pub use view::{ClusterView, LeaderView, LocalHealth, MemberInfo, TermRecord};
