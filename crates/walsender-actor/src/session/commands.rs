//! The replication commands outside streaming: each query is parsed, refused, answered from
//! memory (`IDENTIFY_SYSTEM`, `SHOW`, `READ_REPLICATION_SLOT`), handed to the actor as storage
//! work (`TIMELINE_HISTORY`, `CREATE_REPLICATION_SLOT`, `DROP_REPLICATION_SLOT`: a
//! [`StorageOp`], answered by [`Session::on_storage_done`]), or begins a stream
//! (`START_REPLICATION`, in `stream.rs`).

use std::time::Instant;

use protocol_codec::command::{parse_command, validate_slot_name, ReplicationCommand};
use protocol_codec::{results, ErrorFields, SqlState};

use super::{Mode, Output, Session, StorageDone, StorageOp, StorageView};

impl<S: StorageView> Session<S> {
    pub(super) fn on_query(&mut self, query: &str, now: Instant, out: &mut Vec<Output>) {
        debug_assert!(
            matches!(self.mode, Mode::Idle),
            "queries wait while a command runs"
        );
        if self.stopping.is_some() {
            return self.error(
                ErrorFields::error(
                    SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "cannot execute new commands while WAL sender is in stopping mode",
                ),
                out,
            );
        }
        let cmd = match parse_command(query) {
            Ok(c) => c,
            Err(e) => return self.error(e.to_error_fields(), out),
        };
        if let Some(refusal) = cmd.refusal() {
            return self.error(refusal, out);
        }
        match cmd {
            ReplicationCommand::IdentifySystem => {
                let pos = self.storage.position();
                out.extend(
                    results::identify_system(
                        self.storage.system_id(),
                        pos.timeline,
                        pos.flushed,
                        None,
                    )
                    .into_iter()
                    .map(Output::Msg),
                );
                self.ready(out);
            }
            ReplicationCommand::Show { name } => match self.show(&name) {
                Ok(msgs) => {
                    out.extend(msgs.into_iter().map(Output::Msg));
                    self.ready(out);
                }
                Err(e) => self.error(e, out),
            },
            ReplicationCommand::TimelineHistory { timeline } => {
                self.mode = Mode::Busy;
                out.push(Output::Run(StorageOp::TimelineHistory(timeline)));
            }
            ReplicationCommand::CreateReplicationSlot {
                slot_name,
                temporary,
                reserve_wal,
            } => {
                if let Err(e) = validate_slot_name(&slot_name) {
                    return self.error(e.to_error_fields(), out);
                }
                self.mode = Mode::Busy;
                out.push(Output::Run(StorageOp::CreateSlot {
                    name: slot_name,
                    temporary,
                    reserve_wal,
                }));
            }
            ReplicationCommand::ReadReplicationSlot { slot_name } => {
                if let Err(e) = validate_slot_name(&slot_name) {
                    return self.error(e.to_error_fields(), out);
                }
                let read = self
                    .storage
                    .slot(&slot_name)
                    .ok()
                    .map(|s| results::ReadSlot {
                        slot_type: "physical".to_string(),
                        restart_lsn: s.restart_lsn,
                        restart_tli: s.restart_lsn.and(s.restart_tli),
                    });
                out.extend(
                    results::read_replication_slot(read.as_ref())
                        .into_iter()
                        .map(Output::Msg),
                );
                self.ready(out);
            }
            ReplicationCommand::DropReplicationSlot { slot_name, wait } => {
                // Another session's active slot is "in use"; with WAIT the command waits until
                // that session releases it.
                self.temporary_slots.retain(|s| s != &slot_name);
                self.mode = Mode::Busy;
                out.push(Output::Run(StorageOp::DropSlot {
                    name: slot_name,
                    wait,
                }));
            }
            ReplicationCommand::StartReplication {
                slot_name,
                start,
                timeline,
            } => self.start_replication(slot_name, start, timeline, now, out),
            ReplicationCommand::NotSupported { .. } | ReplicationCommand::Sql { .. } => {
                unreachable!("refused above")
            }
        }
    }

    /// A [`StorageOp`] finished: its answer goes to the client.
    pub fn on_storage_done(&mut self, result: StorageDone, out: &mut Vec<Output>) {
        if !matches!(self.mode, Mode::Busy) {
            return; // The connection ended while the command ran.
        }
        self.mode = Mode::Idle;
        if let Some(slot) = result.temporary_slot {
            self.temporary_slots.push(slot);
        }
        out.extend(result.messages.into_iter().map(Output::Msg));
        if result.failed {
            self.drop_temporary_slots();
        }
        self.ready(out);
    }
}
