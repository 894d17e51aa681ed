//! walsender-actor: one actix actor per replication connection, serving WAL to a standby
//! or pg_receivewal. Empty until the walsender issue fills it; nothing here works yet.
