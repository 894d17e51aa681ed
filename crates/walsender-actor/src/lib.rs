//! walsender-actor: one actix actor per replication connection, serving WAL to a standby or
//! pg_receivewal. Being built under the walsender issue; what exists so far are the plain parts
//! the actor will wrap: access rules ([`hba`]) and lag measurement ([`lag`]).

pub mod hba;
pub mod lag;
pub mod session;
pub mod startup;
pub mod status;
pub mod writer;
