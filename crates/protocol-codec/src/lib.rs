//! protocol-codec: PostgreSQL 15's streaming-replication protocol as bytes in, typed messages
//! out, and back (being built under the protocol-codec issue). No sockets and no actix here.
