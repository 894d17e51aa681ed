//! The failover actor with a real etcd and real nodes in one actix System, on loopback: a
//! primary and two standbys, each with a closed fence and its own actor (ttl 2 s). Every wait
//! is on an event (the actors' leadership watch, an etcd watch) under a deadline.
//!
//! One module per concern: [`harness`] starts the cluster and waits on it; [`election`],
//! [`handover`], [`sync`], [`slots`], [`names`], [`logs`] and [`archive`] hold the tests.

mod archive;
mod election;
mod handover;
mod harness;
mod logs;
mod names;
mod slots;
mod sync;
