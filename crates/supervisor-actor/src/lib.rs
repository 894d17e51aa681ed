//! supervisor-actor: owns a node's children (listener, walreceiver, HTTP API, storage) and
//! their lifecycle. Empty until the walreceiver issue fills it; nothing here works yet.
