//! walreceiver-actor: the actix actor that streams WAL from an upstream into local storage.
//! Empty until the walreceiver issue fills it; nothing here works yet.
