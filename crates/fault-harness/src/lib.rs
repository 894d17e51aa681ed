//! Fault tests of walserver across several hosts, for the test targets only.
//!
//! A test makes a [`netns::Net`] (a bridge in a network namespace of its own) and adds hosts
//! to it (a namespace each, with an address from 10.213.0.0/16 on a veth into the bridge).
//! Traffic flows only between those namespaces; the namespace the test runs in is never
//! changed. On the hosts it runs processes whose output goes to log files printed when the
//! test fails: etcd, the load and other programs as [`process::Process`], and walserver nodes
//! as [`node::WalNode`], the load tool's one `ChildNode` type entering the host's namespace. A
//! wait for what a process should produce (a load's acknowledgements) that gives up says
//! whether it exited and quotes the end of its log ([`process::explain`]). Faults are
//! guards that undo themselves when dropped: link cuts, one-way drops and random loss
//! (nftables in the receiving host), bandwidth caps (tc's token bucket) in [`fault`]; delay
//! and jitter from a user-space proxy ([`proxy`], as this kernel's tc has no netem); cuts of
//! chosen ports only ([`fault::cut_ports`]: etcd's, with replication left open); SIGSTOP
//! and SIGCONT ([`process::Process::pause`]); a small [`tmpfs::Tmpfs`] for a full disk. A real
//! etcd cluster runs one member per host ([`etcd::EtcdCluster`]), for automatic failover.
//! A fault scenario of the `faults` and `chaos` tests records its figures as one
//! [`report::Row`] of the reliability table; the failover scenarios write the failover
//! table's rows instead ([`report`] says which and where). Files other processes write (a
//! load's acknowledgement log, a directory pg_receivewal fills) are waited for through
//! inotify ([`watch`]), never by polling them.
//!
//! Cleanup: every guard removes what it made when dropped, also while a test panics; a
//! [`netns::Net`] kills whatever still runs in its namespaces before deleting them; and the
//! first network or tmpfs of a test process removes the namespaces and mounts this crate left
//! behind in processes that no longer exist (all named `wsf-<pid>-...`).
//!
//! Everything here needs root (namespaces, nft, tc, mount), as CI and the development machine
//! run the tests.

pub mod etcd;
pub mod fault;
pub mod netns;
pub mod node;
pub mod process;
pub mod proxy;
pub mod report;
pub mod tmpfs;
pub mod watch;

pub use etcd::EtcdCluster;
pub use netns::{Host, Net, Request};
pub use node::WalNode;
pub use process::Process;
pub use report::Row;

/// What can go wrong setting up or driving a fault test.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("GET {url}: {message}")]
    Http { url: String, message: String },
    #[error("bad JSON: {0}")]
    Json(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("{0}")]
    Exited(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
