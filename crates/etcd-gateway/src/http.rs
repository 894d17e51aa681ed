//! The transport: one POST per call through `awc`, actix's own HTTP client.
//!
//! `awc` owns HTTP/1.1 (the head, `Content-Length`, chunked encoding); this module owns what is
//! particular to the gateway: which send errors mean nothing was sent (a connection that could
//! not be made, so the call may move to the next endpoint), every wait bounded by the call's
//! deadline, and the streams' framing (one JSON message per line of a body that stays open).
//! Each call builds its own `awc::Client`, so a connection serves one request and is never
//! reused after a failure; dropping a [`Body`] drops the connection, which closes its socket.
//! `awc`'s futures are not `Send`: they run on the actix-rt thread (an arbiter) that polls
//! them.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use awc::error::{ConnectError, PayloadError, SendRequestError};
use awc::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use bytes::{Bytes, BytesMut};
use futures_util::stream::{LocalBoxStream, StreamExt};
use rustls::ClientConfig;
use tokio::time::timeout_at;

use crate::error::{Error, Result};
use crate::security;

/// One etcd client URL, as `http://host:port` or `https://host:port`.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub(crate) url: String,
    /// The host, as the server's certificate must name it.
    host: String,
    tls: bool,
}

impl Endpoint {
    /// Parses `http://host:port`, `https://host:port` or `host:port` (a trailing `/` is
    /// allowed); a `host:port` is spoken to over TLS when `tls_by_default`.
    pub(crate) fn parse(text: &str, tls_by_default: bool) -> Result<Endpoint, &'static str> {
        let (rest, tls) = if let Some(rest) = text.strip_prefix("http://") {
            (rest, false)
        } else if let Some(rest) = text.strip_prefix("https://") {
            (rest, true)
        } else if text.contains("://") {
            return Err("only http:// and https:// endpoints are supported");
        } else {
            (text, tls_by_default)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = rest.rsplit_once(':').ok_or("missing :port")?;
        if host.is_empty() || host.contains('/') {
            return Err("expected host:port");
        }
        let port: u16 = port.parse().map_err(|_| "port is not a number")?;
        let scheme = if tls { "https" } else { "http" };
        Ok(Endpoint {
            url: format!("{scheme}://{host}:{port}"),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            tls,
        })
    }

    pub(crate) fn tls(&self) -> bool {
        self.tls
    }
}

/// How a request reaches etcd: the connect bound, TLS, and the auth token if any.
pub(crate) struct Transport<'a> {
    pub(crate) connect_timeout: Duration,
    pub(crate) tls: Option<&'a Arc<ClientConfig>>,
    /// Whether `tls` presents a client certificate (for what a refusal means).
    pub(crate) client_cert: bool,
    pub(crate) token: Option<&'a str>,
}

/// Why a POST got no answer.
pub(crate) enum SendFailure {
    /// No connection could be made: nothing was sent, another endpoint may be tried.
    NotSent(io::Error),
    /// The TLS handshake failed ([`Error::Tls`]): nothing was sent. Another endpoint may be
    /// tried, though with the same settings it likely fails the same way.
    Tls(Error),
    /// The request was (perhaps partly) sent; it must not be resent.
    Failed(Error),
}

/// POSTs `payload` to `endpoint` + `path` and waits, until `deadline`, for the answer's head.
/// Returns the status and the body. Connecting is bounded by `connect_timeout` as well.
pub(crate) async fn post(
    endpoint: &Endpoint,
    path: &'static str,
    payload: Bytes,
    transport: &Transport<'_>,
    deadline: Instant,
    timeout: Duration,
) -> Result<(u16, Body), SendFailure> {
    let context = Context {
        endpoint: endpoint.url.clone(),
        host: endpoint.host.clone(),
        client_cert: transport.client_cert,
        path,
        timeout,
    };
    // The handshake is part of connecting, under the same bound.
    let mut connector = awc::Connector::new()
        .timeout(transport.connect_timeout)
        .handshake_timeout(transport.connect_timeout);
    if endpoint.tls {
        let Some(tls) = transport.tls else {
            // `Client` refuses an https endpoint without a CA; this is only a second guard.
            return Err(SendFailure::NotSent(io::Error::other(
                "an https endpoint without a CA certificate",
            )));
        };
        connector = connector.rustls_0_23(tls.clone());
    }
    // The call's deadline is ours (below); awc's own request timeout would end a watch's
    // stream, and its redirects would resend a request elsewhere.
    let client = awc::Client::builder()
        .disable_timeout()
        .disable_redirects()
        .connector(connector)
        .finish();
    let mut request = client
        .post(format!("{}{path}", endpoint.url))
        .insert_header((CONTENT_TYPE, "application/json"))
        .insert_header((ACCEPT, "application/json"));
    if let Some(token) = transport.token {
        // etcd's gateway passes this header on as the gRPC `authorization` metadata, where
        // etcd looks for the token (bare, without a scheme).
        request = request.insert_header((AUTHORIZATION, token));
    }
    let send = request.send_body(payload);
    let response = match timeout_at(deadline.into(), send).await {
        Err(_elapsed) => return Err(SendFailure::Failed(context.timeout())),
        // awc also reports a connection closed after the request went out, before the answer's
        // head, as `Connect(Disconnected)`: that request was sent and may have been applied.
        Ok(Err(SendRequestError::Connect(ConnectError::Disconnected))) => {
            return Err(SendFailure::Failed(context.io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed before the answer",
            ))))
        }
        Ok(Err(SendRequestError::Connect(e))) => {
            let e = connect_io(e);
            return Err(match context.tls(&e) {
                Some(tls) => SendFailure::Tls(tls),
                None => SendFailure::NotSent(e),
            });
        }
        Ok(Err(e)) => return Err(SendFailure::Failed(context.send_error(e))),
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    Ok((
        status,
        Body {
            stream: response.boxed_local(),
            pending: BytesMut::new(),
            ended: false,
            context,
        },
    ))
}

/// A connection error as the `io::Error` that [`Error::Connect`] carries.
fn connect_io(e: ConnectError) -> io::Error {
    match e {
        ConnectError::Io(e) => e,
        ConnectError::Timeout => io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        other => io::Error::other(other.to_string()),
    }
}

/// What an error after sending names: the endpoint, the call and its timeout.
#[derive(Clone, Debug)]
struct Context {
    endpoint: String,
    host: String,
    client_cert: bool,
    path: &'static str,
    timeout: Duration,
}

impl Context {
    /// [`Error::Tls`] if `e` is (or wraps) a TLS failure.
    fn tls(&self, e: &(dyn std::error::Error + 'static)) -> Option<Error> {
        let tls = security::tls_error(e)?;
        Some(Error::Tls {
            endpoint: self.endpoint.clone(),
            reason: security::describe(tls, &self.host, self.client_cert),
            source: io::Error::other(tls.clone()),
        })
    }

    fn timeout(&self) -> Error {
        Error::Timeout {
            endpoint: self.endpoint.clone(),
            path: self.path,
            after_ms: self.timeout.as_millis(),
        }
    }

    fn io(&self, source: io::Error) -> Error {
        Error::Io {
            endpoint: self.endpoint.clone(),
            path: self.path,
            source,
        }
    }

    fn send_error(&self, e: SendRequestError) -> Error {
        // awc's errors do not all name their cause as a `source`; the I/O errors that can
        // carry a TLS alert are taken out by hand.
        let io = match &e {
            SendRequestError::Send(io) => Some(io),
            SendRequestError::Response(parse) => std::error::Error::source(parse)
                .and_then(|source| source.downcast_ref::<io::Error>()),
            _ => None,
        };
        if let Some(tls) = io.and_then(|io| self.tls(io)).or_else(|| self.tls(&e)) {
            return tls;
        }
        match e {
            SendRequestError::Timeout => self.timeout(),
            SendRequestError::Send(e) => self.io(e),
            SendRequestError::Response(e) => Error::malformed(self.path, e.to_string()),
            other => self.io(io::Error::other(other.to_string())),
        }
    }

    fn payload_error(&self, e: PayloadError) -> Error {
        let io = match &e {
            PayloadError::Incomplete(Some(io)) | PayloadError::Io(io) => Some(io),
            _ => None,
        };
        if let Some(tls) = io.and_then(|io| self.tls(io)).or_else(|| self.tls(&e)) {
            return tls;
        }
        match e {
            // A body that is not HTTP (bad chunk sizes) rather than one cut short.
            PayloadError::Incomplete(Some(e)) | PayloadError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput
                ) =>
            {
                Error::malformed(self.path, e.to_string())
            }
            PayloadError::Incomplete(Some(e)) | PayloadError::Io(e) => self.io(e),
            PayloadError::Incomplete(None) => self.io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the body ended early",
            )),
            other => Error::malformed(self.path, other.to_string()),
        }
    }
}

/// An answer's body, read under a deadline; dropping it closes the connection.
pub(crate) struct Body {
    stream: LocalBoxStream<'static, Result<Bytes, PayloadError>>,
    /// Bytes read but not yet handed out (the start of a message).
    pending: BytesMut,
    ended: bool,
    context: Context,
}

impl Body {
    /// The next piece of the body; `None` at its end. Waits until `deadline` (forever with
    /// `None`, as a quiet watch must).
    async fn chunk(&mut self, deadline: Option<Instant>) -> Result<Option<Bytes>> {
        if self.ended {
            return Ok(None);
        }
        let next = match deadline {
            None => self.stream.next().await,
            Some(deadline) => timeout_at(deadline.into(), self.stream.next())
                .await
                .map_err(|_elapsed| self.context.timeout())?,
        };
        match next {
            None => {
                self.ended = true;
                Ok(None)
            }
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(e)) => {
                self.ended = true;
                Err(self.context.payload_error(e))
            }
        }
    }

    /// Reads the whole body, refusing one longer than `limit` bytes.
    pub(crate) async fn read_all(&mut self, limit: usize, deadline: Instant) -> Result<Bytes> {
        let mut all = std::mem::take(&mut self.pending);
        while let Some(bytes) = self.chunk(Some(deadline)).await? {
            if all.len() + bytes.len() > limit {
                return Err(Error::malformed(
                    self.context.path,
                    format!("response body longer than {limit} bytes"),
                ));
            }
            all.extend_from_slice(&bytes);
        }
        Ok(all.freeze())
    }

    /// The next message of a stream (a line, without its line end), at most `limit` bytes;
    /// `None` at the end of the body. Blank lines are skipped; a last message without a line
    /// end counts.
    pub(crate) async fn read_message(
        &mut self,
        limit: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Bytes>> {
        loop {
            let path = self.context.path;
            if let Some(line) = take_line(&mut self.pending, limit)
                .map_err(|reason| Error::malformed(path, reason))?
            {
                return Ok(Some(line));
            }
            match self.chunk(deadline).await? {
                Some(bytes) => self.pending.extend_from_slice(&bytes),
                None => return Ok(take_rest(&mut self.pending)),
            }
        }
    }
}

/// Takes the first non-blank complete line out of `buffer`; `None` when there is none yet.
/// A partial line longer than `limit` is an error, since it can never be accepted.
fn take_line(buffer: &mut BytesMut, limit: usize) -> Result<Option<Bytes>, String> {
    while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
        let line = trim(buffer.split_to(end + 1).freeze());
        if line.len() > limit {
            return Err(format!("message longer than {limit} bytes"));
        }
        if !line.is_empty() {
            return Ok(Some(line));
        }
    }
    if buffer.len() > limit {
        return Err(format!("message longer than {limit} bytes"));
    }
    Ok(None)
}

/// What is left at the end of a body, as a last message unless it is blank.
fn take_rest(buffer: &mut BytesMut) -> Option<Bytes> {
    let rest = trim(buffer.split().freeze());
    (!rest.is_empty()).then_some(rest)
}

/// A line without surrounding whitespace (its line end, a stray `\r`).
fn trim(line: Bytes) -> Bytes {
    let start = line
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    line.slice(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        let e = Endpoint::parse("http://127.0.0.1:2379/", false).expect("parses");
        assert_eq!((e.url.as_str(), e.tls), ("http://127.0.0.1:2379", false));
        let e = Endpoint::parse("[::1]:2379", false).expect("parses");
        assert_eq!(e.url, "http://[::1]:2379");
        assert_eq!(e.host, "::1");
        let e = Endpoint::parse("https://etcd.example:2379", false).expect("parses");
        assert_eq!((e.url.as_str(), e.tls), ("https://etcd.example:2379", true));
        assert_eq!(e.host, "etcd.example");
        // With a CA, a bare host:port is spoken to over TLS; an explicit http:// is not.
        let e = Endpoint::parse("127.0.0.1:2379", true).expect("parses");
        assert_eq!((e.url.as_str(), e.tls), ("https://127.0.0.1:2379", true));
        let e = Endpoint::parse("http://127.0.0.1:2379", true).expect("parses");
        assert!(!e.tls);
        let no = |text| Endpoint::parse(text, false).unwrap_err();
        assert_eq!(
            no("unix://x:1"),
            "only http:// and https:// endpoints are supported"
        );
        assert_eq!(no("h"), "missing :port");
        assert_eq!(no("h:port"), "port is not a number");
        assert_eq!(no("http://a/b:1"), "expected host:port");
        assert_eq!(no(":1"), "expected host:port");
    }

    #[test]
    fn lines_are_messages_across_pieces() {
        let mut buffer = BytesMut::new();
        let mut seen = Vec::new();
        // Pieces that cut a message, a CRLF and a blank line apart.
        for piece in [&b"{\"a\""[..], b":1}\r", b"\n\n  \n{\"b\":2}\n{\"c\""] {
            buffer.extend_from_slice(piece);
            while let Some(line) = take_line(&mut buffer, 64).expect("within the limit") {
                seen.push(line);
            }
        }
        assert_eq!(seen, [&b"{\"a\":1}"[..], b"{\"b\":2}"]);
        assert_eq!(take_rest(&mut buffer).as_deref(), Some(&b"{\"c\""[..]));
        assert_eq!(take_rest(&mut buffer), None);
        buffer.extend_from_slice(b" \r\n");
        assert_eq!(take_rest(&mut buffer), None, "a blank tail is no message");
    }

    #[test]
    fn an_overlong_message_is_refused_before_it_ends() {
        let mut buffer = BytesMut::from(&b"0123456789"[..]);
        assert!(take_line(&mut buffer, 9)
            .unwrap_err()
            .contains("longer than 9"));
        let mut buffer = BytesMut::from(&b"0123456789\n"[..]);
        assert!(take_line(&mut buffer, 9).is_err());
        let mut buffer = BytesMut::from(&b"012345678\n"[..]);
        assert_eq!(
            take_line(&mut buffer, 9).expect("fits").as_deref(),
            Some(&b"012345678"[..])
        );
    }
}
