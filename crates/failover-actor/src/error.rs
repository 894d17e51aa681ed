//! The failover crate's one error enum.

#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_gateway::Error),
    #[error("no member named {0}")]
    NoSuchMember(String),
    #[error("{0} cannot become the leader: {1}")]
    NotEligible(String, String),
    #[error("there is no leader")]
    NoLeader,
    #[error("the cluster is paused")]
    Paused,
    #[error("the failover actor is not running")]
    NotRunning,
    #[error("{0}")]
    Refused(String),
    /// A name that cannot be a permanent slot's.
    #[error("{0}")]
    BadSlotName(String),
    /// Another live process holds this member name: its member key is on a lease not ours.
    #[error("node_name \"{name}\" is held by another live process (its member key is on lease {lease}; it advertises {advertised}): one process per member name")]
    NameHeld {
        name: String,
        lease: etcd_gateway::LeaseId,
        advertised: String,
    },
}
