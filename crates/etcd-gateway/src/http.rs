//! Just enough HTTP/1.1 for etcd's gateway, on `std::net::TcpStream`.
//!
//! One request per connection (`Connection: close`): a POST with a JSON body, then a response
//! head and a body framed by `Content-Length`, by chunked transfer encoding (the gateway's
//! streams and its errors), or by the connection's end. Owning the socket is the reason this
//! is not a general HTTP client: every read runs under the call's deadline (the read timeout is
//! set to what is left of it before each read), and a watch is ended from another thread by
//! shutting its socket down.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The most a response head may take. The gateway's heads are a few hundred bytes; this is a
/// guess with a wide margin, there only to bound memory against a wrong server.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The longest chunk-size line (size, extensions) accepted.
const MAX_CHUNK_LINE: usize = 1024;

/// One etcd client URL, as `http://host:port`.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub(crate) url: String,
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `http://host:port` or `host:port` (a trailing `/` is allowed). TLS is not
    /// supported: an `https://` URL is refused rather than spoken to in plain text.
    pub(crate) fn parse(text: &str) -> Result<Endpoint, &'static str> {
        let rest = if let Some(rest) = text.strip_prefix("http://") {
            rest
        } else if text.starts_with("https://") {
            return Err("https is not supported by this client");
        } else if text.contains("://") {
            return Err("only http:// endpoints are supported");
        } else {
            text
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = rest.rsplit_once(':').ok_or("missing :port")?;
        if host.is_empty() || host.contains('/') {
            return Err("expected host:port");
        }
        let port: u16 = port.parse().map_err(|_| "port is not a number")?;
        Ok(Endpoint {
            url: format!("http://{host}:{port}"),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
        })
    }

    /// Connects to the first of the host's addresses that accepts within `timeout`.
    pub(crate) fn connect(&self, timeout: Duration) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolved to no address");
        for addr in (self.host.as_str(), self.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A socket whose reads end at a deadline (or never, with `None`).
pub(crate) struct DeadlineStream {
    stream: TcpStream,
    deadline: Option<Instant>,
}

impl DeadlineStream {
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = match self.deadline {
            None => None,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Some(left)
            }
        };
        self.stream.set_read_timeout(timeout)?;
        self.stream.read(buf)
    }
}

/// Whether an I/O error is a read or write timeout (Linux reports `WouldBlock` for them).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Sends one POST on a connected socket; the write is bounded by `deadline`.
pub(crate) fn send_post(
    stream: &TcpStream,
    endpoint: &Endpoint,
    path: &str,
    body: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    stream.set_write_timeout(Some(left))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        endpoint.host_header(),
        body.len()
    );
    let mut message = Vec::with_capacity(head.len() + body.len());
    message.extend_from_slice(head.as_bytes());
    message.extend_from_slice(body);
    let mut writer = stream;
    writer.write_all(&message)?;
    writer.flush()
}

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// A response whose head has been read; [`Response::body`] reads the rest.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Body,
}

/// A response head that is not HTTP, in words.
#[derive(Debug)]
pub(crate) enum HeadError {
    Io(io::Error),
    Malformed(String),
}

impl From<io::Error> for HeadError {
    fn from(e: io::Error) -> HeadError {
        HeadError::Io(e)
    }
}

/// Reads a response head from `stream`, whose reads end at `deadline`.
pub(crate) fn read_response(
    stream: TcpStream,
    deadline: Option<Instant>,
) -> Result<Response, HeadError> {
    let mut reader = BufReader::new(DeadlineStream { stream, deadline });
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = read_line_bounded(&mut reader, &mut head, MAX_HEAD_BYTES - before)?;
        if n == 0 {
            return Err(HeadError::Malformed(
                "connection closed before the response head ended".into(),
            ));
        }
        if &head[before..] == b"\r\n" || &head[before..] == b"\n" {
            break;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut headers);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(HeadError::Malformed("incomplete response head".into()))
        }
        Err(e) => return Err(HeadError::Malformed(format!("bad response head: {e}"))),
    }
    let status = parsed
        .code
        .ok_or_else(|| HeadError::Malformed("no status code".into()))?;
    let mut framing = Framing::UntilClose;
    for header in parsed.headers.iter() {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = String::from_utf8_lossy(header.value);
            if value.to_ascii_lowercase().contains("chunked") {
                framing = Framing::Chunked;
            }
        } else if header.name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked
        {
            let value = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| HeadError::Malformed("bad Content-Length".into()))?;
            framing = Framing::Length(value);
        }
    }
    let state = match framing {
        Framing::Length(n) => BodyState::Length { left: n },
        Framing::Chunked => BodyState::ChunkStart { first: true },
        Framing::UntilClose => BodyState::UntilClose,
    };
    Ok(Response {
        status,
        body: Body { reader, state },
    })
}

/// Appends one line (through `\n`) of at most `max` bytes to `out`; returns its length (0 at
/// the end of the stream).
fn read_line_bounded<R: BufRead>(
    reader: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> io::Result<usize> {
    let mut taken = 0;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(taken);
        }
        let (used, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if taken + used > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        out.extend_from_slice(&available[..used]);
        reader.consume(used);
        taken += used;
        if done {
            return Ok(taken);
        }
    }
}

#[derive(Debug)]
enum BodyState {
    Length {
        left: u64,
    },
    /// Before a chunk-size line; `first` is false when the previous chunk's CRLF is still due.
    ChunkStart {
        first: bool,
    },
    InChunk {
        left: u64,
    },
    UntilClose,
    Done,
}

/// A response body: the bytes of the entity, with the transfer framing removed.
pub(crate) struct Body {
    reader: BufReader<DeadlineStream>,
    state: BodyState,
}

impl Body {
    /// Moves the deadline of every later read (a watch clears it once created).
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.reader.get_mut().set_deadline(deadline);
    }

    /// A second handle on the socket, to shut it down from another thread.
    pub(crate) fn try_clone_socket(&self) -> io::Result<TcpStream> {
        self.reader.get_ref().stream.try_clone()
    }

    /// Reads the whole body, refusing one longer than `limit` bytes.
    pub(crate) fn read_all(&mut self, limit: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let n = self.by_ref().take(limit + 1).read_to_end(&mut out)?;
        if n as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("response body longer than {limit} bytes"),
            ));
        }
        Ok(out)
    }

    /// Reads one newline-terminated message of at most `limit` bytes, without the newline;
    /// `None` at the end of the body. Blank lines between messages are skipped.
    pub(crate) fn read_message(&mut self, limit: usize) -> io::Result<Option<Vec<u8>>> {
        loop {
            let mut line = Vec::new();
            let n = read_line_bounded(self, &mut line, limit)?;
            if n == 0 {
                return Ok(None);
            }
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(line));
            }
        }
    }

    /// The entity bytes available without crossing a chunk boundary (empty at the end),
    /// reading from the socket if none are buffered.
    fn fill_entity(&mut self) -> io::Result<&[u8]> {
        loop {
            match self.state {
                BodyState::Done => return Ok(&[]),
                BodyState::Length { left: 0 } => {
                    self.state = BodyState::Done;
                }
                BodyState::ChunkStart { first } => {
                    if !first {
                        let mut crlf = Vec::new();
                        read_line_bounded(&mut self.reader, &mut crlf, 2)?;
                        if crlf != b"\r\n" && crlf != b"\n" {
                            return Err(bad_chunk("missing CRLF after a chunk"));
                        }
                    }
                    let mut line = Vec::new();
                    if read_line_bounded(&mut self.reader, &mut line, MAX_CHUNK_LINE)? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let text = std::str::from_utf8(&line).map_err(|_| bad_chunk("chunk size"))?;
                    let size = text.split(';').next().unwrap_or("").trim();
                    let size =
                        u64::from_str_radix(size, 16).map_err(|_| bad_chunk("chunk size"))?;
                    if size == 0 {
                        // The last chunk. Trailers may follow (the gateway sends one on
                        // errors); the connection closes after them, so they are not read.
                        self.state = BodyState::Done;
                    } else {
                        self.state = BodyState::InChunk { left: size };
                    }
                }
                BodyState::InChunk { left: 0 } => {
                    self.state = BodyState::ChunkStart { first: false };
                }
                BodyState::Length { left } | BodyState::InChunk { left } => {
                    let buffered = self.reader.fill_buf()?;
                    if buffered.is_empty() {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let n = buffered
                        .len()
                        .min(usize::try_from(left).unwrap_or(usize::MAX));
                    return Ok(&self.reader.buffer()[..n]);
                }
                BodyState::UntilClose => return self.reader.fill_buf(),
            }
        }
    }

    fn consume_entity(&mut self, n: usize) {
        self.reader.consume(n);
        match &mut self.state {
            BodyState::Length { left } | BodyState::InChunk { left } => *left -= n as u64,
            _ => {}
        }
    }
}

fn bad_chunk(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad chunked encoding: {what}"),
    )
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_entity()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume_entity(n);
        Ok(n)
    }
}

impl BufRead for Body {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.fill_entity()
    }

    fn consume(&mut self, n: usize) {
        self.consume_entity(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        let e = Endpoint::parse("http://127.0.0.1:2379/").expect("parses");
        assert_eq!(
            (e.url.as_str(), e.host_header()),
            ("http://127.0.0.1:2379", "127.0.0.1:2379".into())
        );
        let e = Endpoint::parse("[::1]:2379").expect("parses");
        assert_eq!(
            (e.host.as_str(), e.host_header()),
            ("::1", "[::1]:2379".into())
        );
        assert_eq!(
            Endpoint::parse("https://h:1").unwrap_err(),
            "https is not supported by this client"
        );
        assert_eq!(
            Endpoint::parse("unix://x:1").unwrap_err(),
            "only http:// endpoints are supported"
        );
        assert_eq!(Endpoint::parse("h").unwrap_err(), "missing :port");
        assert_eq!(
            Endpoint::parse("h:port").unwrap_err(),
            "port is not a number"
        );
        assert_eq!(
            Endpoint::parse("http://a/b:1").unwrap_err(),
            "expected host:port"
        );
        assert_eq!(Endpoint::parse(":1").unwrap_err(), "expected host:port");
    }
}
