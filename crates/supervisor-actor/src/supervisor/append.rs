//! The supervisor's side of appends: refused before anything is written when the node may
//! not take them (a standby, a shutdown, a closed fence), made durable by storage's group
//! commit, then waited on until their durability level holds, and answered only if the fence
//! still lets the node acknowledge.

use std::time::Instant;

use actix::prelude::*;
use wal_storage::WalFormat;
use walsender_actor::messages::WaitForSync;

use super::Supervisor;
use crate::error::AppendError;
use crate::messages::{AppendRecords, Appended};
use crate::status::NodeRole;

impl Handler<AppendRecords> for Supervisor {
    type Result = ResponseFuture<Result<Appended, AppendError>>;

    fn handle(&mut self, msg: AppendRecords, _: &mut Context<Self>) -> Self::Result {
        let wal = self.wal.clone();
        let refusal = if self.shutting_down {
            Some(AppendError::ShuttingDown)
        } else if wal
            .as_ref()
            .is_some_and(|w| w.format() != WalFormat::Walserver)
        {
            // Said before "this node is a standby; append on the primary", which would send
            // the client to a PostgreSQL server that takes no walserver records either.
            Some(AppendError::RelayedPostgresWal)
        } else if self.role == NodeRole::Standby || self.promoting {
            Some(AppendError::Standby)
        } else if self.storage.new_timeline {
            // Storage reopens on a new timeline (rule 5 of the overlapped commit): nothing
            // may be written on the old one in between.
            Some(AppendError::Storage(wal_storage::WalError::StorageFailed {
                reason: "storage is being reopened on a new timeline".into(),
            }))
        } else if self.following || !self.fence.may_acknowledge(Instant::now()) {
            // Refused before anything is written: a record this node wrote without leading
            // could only be dropped again when it follows the leader.
            Some(AppendError::NotLeader {
                term: self.fence.term(),
            })
        } else {
            None
        };
        let fence = self.fence.clone();
        let registry = self.registry.clone();
        let durability = msg.durability.unwrap_or(self.sync.default_durability);
        let wait_timeout = self.sync.wait_timeout;
        // Without synchronous standbys every level is satisfied by local durability, as in
        // PostgreSQL; skip the trip to the registry.
        let sync_configured = self.sync.standby_names.is_some();
        let metrics = self.append_metrics.clone();
        let started = Instant::now();
        let records = msg.records.len() as u64;
        let bytes = msg.records.iter().map(|r| r.len() as u64).sum();
        let sync_metrics = metrics.clone();
        let work = async move {
            if let Some(e) = refusal {
                return Err(e);
            }
            let wal = wal.ok_or(AppendError::ShuttingDown)?;
            if wal.format() != WalFormat::Walserver {
                return Err(AppendError::RelayedPostgresWal);
            }
            if msg.records.is_empty() {
                return Err(AppendError::Empty);
            }
            // Local durability first: storage's group commit. The answer is picked up when
            // the flush's announcement reaches this thread's relay, which wakes the thread
            // once for this append and the walsenders that send it.
            let record_ends = wal
                .append(msg.records)?
                .ride(&mut actor_util::relayed(wal.subscribe()))
                .await?;
            let end_lsn = *record_ends
                .last()
                .expect("one end per record, and there are records");
            // Then the synchronous standbys, if the level asks for them. The wait also ends
            // when the fence closes: an answer after that could not be an acknowledgement.
            if let Some(level) = durability.wait_level().filter(|_| sync_configured) {
                let wait = registry.send(WaitForSync {
                    lsn: end_lsn,
                    level,
                });
                let waited = Instant::now();
                let timeout = async move {
                    match wait_timeout {
                        Some(t) => tokio::time::sleep(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    outcome = wait => match outcome {
                        Ok(Ok(())) => sync_metrics.sync_wait_seconds.observe(waited.elapsed()),
                        _ => return Err(AppendError::ShuttingDown),
                    },
                    () = timeout => {
                        return Err(AppendError::NotConfirmed {
                            end_lsn,
                            durability,
                        })
                    }
                    () = fence.wait_closed() => {}
                }
            }
            // The last look at the fence, just before answering: durable here after the
            // leadership ended is not acknowledged.
            if !fence.may_acknowledge(Instant::now()) {
                return Err(AppendError::Indeterminate {
                    end_lsn,
                    reason: match fence.term() {
                        Some(t) => format!("this node's leadership (term {t}) ended before the append was acknowledged"),
                        None => "this node's leadership ended before the append was acknowledged".into(),
                    },
                });
            }
            Ok(Appended {
                end_lsn,
                record_ends,
                timeline: wal.timeline(),
                durability,
            })
        };
        Box::pin(async move {
            let r = work.await;
            match &r {
                Ok(_) => metrics.acknowledged(durability, records, bytes, started.elapsed()),
                Err(_) => metrics.failed(durability),
            }
            r
        })
    }
}
