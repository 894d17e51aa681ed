//! The write side of a connection: a bounded queue of frames drained by one tokio task.
//!
//! actix's own `FramedWrite` buffers without bound when the socket is slow (its
//! `set_buffer_capacity` has no effect on tokio I/O; one measured handler reached a 1 GiB
//! resident set), so a standby that stops reading would make the walsender hold every byte
//! it wants to send. Here the actor hands frames to a bounded channel instead; the task writes
//! them with vectored I/O, so an XLogData payload read from storage reaches the socket without
//! being copied into an intermediate buffer. When the queue is full the actor stops reading
//! WAL and asks to be woken once there is room again; control messages never wait behind a
//! full queue for long, because the queue drains at the socket's pace.
//!
//! On a plain TCP connection a frame's WAL may also be a range of a segment file
//! ([`WalFileRange`]): the task sends it with `sendfile`, so the WAL goes from the page cache
//! to the socket without being copied into this process at all. `sendfile` may read from disk,
//! so it runs on tokio's blocking pool, on a duplicate of the socket's descriptor; the task
//! waits for the socket to be writable between calls, as for any write. The header in front
//! of a range goes with `MSG_MORE`, so that the kernel puts it in the packet with the pages
//! instead of sending it alone, and a batch of several frames is sent with `TCP_CORK` set, so
//! that the frames fill whole packets (see `Cork` below).

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use actor_util::set_int_option;
use bytes::{Buf, Bytes};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWrite, AsyncWriteExt, Interest};
use tokio::sync::{mpsc, oneshot};
use wal_storage::WalFileRange;

/// One unit of output: a small header (message type, length and any fixed fields) and an
/// optional payload that is written after it without copying, from memory or from a file.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub head: Bytes,
    pub body: Bytes,
    /// Written after `body`; only queued on a connection whose writer has a [`FileSocket`].
    pub file: Option<WalFileRange>,
}

impl Frame {
    pub fn new(head: Bytes) -> Frame {
        Frame {
            head,
            body: Bytes::new(),
            file: None,
        }
    }

    pub fn with_body(head: Bytes, body: Bytes) -> Frame {
        Frame {
            head,
            body,
            file: None,
        }
    }

    pub fn with_file(head: Bytes, file: WalFileRange) -> Frame {
        Frame {
            head,
            body: Bytes::new(),
            file: Some(file),
        }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.body.len() + self.file.as_ref().map_or(0, |f| f.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

enum Command {
    Write(Frame),
    /// Everything queued before this is written and flushed; then the sender is told.
    Flush(oneshot::Sender<()>),
}

/// The actor's end of the queue.
#[derive(Clone)]
pub struct FrameSender {
    tx: mpsc::Sender<Command>,
}

/// Why a frame could not be queued.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The queue is full; try again after [`FrameSender::ready`] resolves.
    Full,
    /// The writer task has ended (the socket failed or the connection is closing).
    Closed,
}

impl FrameSender {
    /// Queues a frame without waiting.
    pub fn try_send(&self, frame: Frame) -> Result<(), (QueueError, Frame)> {
        self.tx
            .try_send(Command::Write(frame))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(Command::Write(f)) => (QueueError::Full, f),
                mpsc::error::TrySendError::Closed(Command::Write(f)) => (QueueError::Closed, f),
                _ => unreachable!("only Write commands are sent through try_send"),
            })
    }

    /// Free places in the queue right now.
    pub fn capacity(&self) -> usize {
        self.tx.capacity()
    }

    /// Resolves when at least one place is free (or the writer has gone).
    pub fn ready(&self) -> impl std::future::Future<Output = ()> + 'static {
        let tx = self.tx.clone();
        async move {
            // The permit is dropped at once: it only tells us there is room.
            let _ = tx.reserve().await;
        }
    }

    /// Queues `frame` once there is room, giving up this sender with it: when no other sender
    /// is left, the writer ends after writing it. This is how a closing connection whose queue
    /// is full of WAL still says its last words (a FATAL, say) after that WAL.
    pub async fn send_last(self, frame: Frame) -> Result<(), QueueError> {
        self.tx
            .send(Command::Write(frame))
            .await
            .map_err(|_| QueueError::Closed)
    }

    /// Resolves once every frame queued so far has been written to the socket and flushed.
    pub fn flushed(&self) -> impl std::future::Future<Output = Result<(), QueueError>> + 'static {
        let tx = self.tx.clone();
        async move {
            let (done_tx, done_rx) = oneshot::channel();
            tx.send(Command::Flush(done_tx))
                .await
                .map_err(|_| QueueError::Closed)?;
            done_rx.await.map_err(|_| QueueError::Closed)
        }
    }
}

/// How many frames may wait in the queue. With XLogData of at most 128 KiB this bounds the
/// queued bytes of one connection to about 1 MiB, on top of what the socket's own buffer holds.
/// Measured with `walserver bench stream` (benches/README.md): 8 frames stream as fast as 32
/// did (one standby on tmpfs about 1.5 GB/s, a codec client about 4 GB/s, 16 pg_receivewal
/// about 1.5 GB/s together) with a third to a half less memory per walsender.
pub const QUEUE_FRAMES: usize = 8;

/// How many frames may wait in the queue of a writer with a [`FileSocket`]. There catch-up
/// frames are file ranges, a few dozen bytes each in memory, and frames of bytes come only
/// from storage's tail cache, so a longer queue costs little memory; it lets one call on the
/// blocking pool send up to 4 MiB instead of 1 MiB, and the pool's hand-offs per MB fall by
/// about as much. Measured (benches/send-path.md): 32 frames against 8, context switches per
/// MB 2.1 to 0.75, CPU per MB 0.29 to 0.24-0.25 ms. 4 MiB is also the most WAL a control
/// message may wait behind in the queue (a few ms on loopback, more on a slow link).
pub const FILE_QUEUE_FRAMES: usize = 32;

/// Frames written with one vectored call at most; bounded by IOV_MAX (1024) with room to spare.
const MAX_BATCH: usize = 64;

/// Creates the queue and the future that drains it into `sink`. The future ends with `Ok(())`
/// when every [`FrameSender`] has been dropped and all frames are written (then it shuts the
/// sink down), or with the first write error.
pub fn frame_queue<W>(
    sink: W,
) -> (
    FrameSender,
    impl std::future::Future<Output = io::Result<()>>,
)
where
    W: AsyncWrite + Unpin,
{
    frame_queue_with_files(sink, None)
}

/// Like [`frame_queue`], with `files`, a duplicate of the plain TCP socket under `sink`, for
/// frames whose WAL is a file range; the queue then holds [`FILE_QUEUE_FRAMES`]. Without it
/// such a frame's range is read on the blocking pool and written from memory.
pub fn frame_queue_with_files<W>(
    sink: W,
    files: Option<FileSocket>,
) -> (
    FrameSender,
    impl std::future::Future<Output = io::Result<()>>,
)
where
    W: AsyncWrite + Unpin,
{
    let frames = if files.is_some() {
        FILE_QUEUE_FRAMES
    } else {
        QUEUE_FRAMES
    };
    let (tx, rx) = mpsc::channel(frames);
    (FrameSender { tx }, drain(sink, files, rx))
}

/// A duplicate descriptor of a connection's plain TCP socket, for `sendfile`.
pub struct FileSocket(Arc<OwnedFd>);

impl FileSocket {
    /// Duplicates the descriptor of `socket`.
    pub fn duplicate(socket: &impl std::os::fd::AsFd) -> io::Result<FileSocket> {
        Ok(FileSocket(Arc::new(socket.as_fd().try_clone_to_owned()?)))
    }
}

/// Sends file ranges into the socket; registered with the runtime of the writer's task.
struct FileSender {
    fd: AsyncFd<Arc<OwnedFd>>,
}

impl FileSender {
    fn new(s: FileSocket) -> io::Result<FileSender> {
        // SAFETY: the descriptor is owned by the Arc inside the AsyncFd, so it stays open and
        // names the same socket for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register_with_interest(s.0, Interest::WRITABLE) }?;
        Ok(FileSender { fd })
    }

    /// Sends `pieces` in order. One call on the blocking pool sends as much as the socket
    /// takes, so a batch of frames costs one hand-off to the pool, not one per frame.
    async fn send(&self, pieces: Vec<Piece>) -> io::Result<()> {
        let pieces = Arc::new(pieces);
        let mut at = (0, 0);
        while at.0 < pieces.len() {
            // The readiness is taken before the call: if the socket fills, clearing it below
            // forgets only this readiness, never a later one, so no wake-up is lost.
            let mut ready = self.fd.writable().await?;
            let socket = self.fd.get_ref().clone();
            let todo = pieces.clone();
            let (reached, blocked) = tokio::task::spawn_blocking(move || {
                // More than one frame left (each is a header and its range): a catch-up batch,
                // corked so that no frame's last partial packet leaves on its own.
                let _cork = Cork::on(&socket, todo.len() - at.0 > 2);
                send_until_full(&socket, &todo, at)
            })
            .await
            .map_err(io::Error::other)??;
            at = reached;
            if blocked {
                ready.clear_ready();
            }
        }
        Ok(())
    }
}

/// `TCP_CORK` on a socket for as long as the guard lives; uncorking when it is dropped sends
/// what is left at once.
///
/// With `TCP_NODELAY` (every walsender's socket) each `sendfile` call ends with a push, so a
/// 128 KiB XLogData became two full loopback packets and one of a few hundred bytes; the
/// header's `MSG_MORE` cannot reach across the call. Corked, the frames of one batch fill whole
/// packets. Measured on loopback (benches/send-path.md): TCP segments per MB 39-43 to 22-24 and
/// the sender's CPU per MB 0.49-0.58 to 0.42-0.48 ms (medians 0.53 and 0.46). Failing to set
/// it only costs packets, so errors are ignored.
struct Cork<'a> {
    socket: Option<&'a OwnedFd>,
}

impl<'a> Cork<'a> {
    fn on(socket: &'a OwnedFd, wanted: bool) -> Cork<'a> {
        let socket = wanted.then_some(socket).filter(|s| set_cork(s, true));
        Cork { socket }
    }
}

impl Drop for Cork<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.socket {
            set_cork(s, false);
        }
    }
}

/// Sets or clears `TCP_CORK`; whether the call succeeded.
fn set_cork(socket: &OwnedFd, on: bool) -> bool {
    set_int_option(
        socket,
        libc::IPPROTO_TCP,
        libc::TCP_CORK,
        libc::c_int::from(on),
    )
    .is_ok()
}

/// Output for the file sender: bytes in memory, or a range of a segment file.
enum Piece {
    Mem(Bytes),
    File(WalFileRange),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Mem(b) => b.len(),
            Piece::File(r) => r.len,
        }
    }
}

/// Sends `pieces` from `at` (a piece and an offset in it) into the non-blocking `socket` until
/// all are sent or the socket is full: memory with `sendmsg`, file ranges with `sendfile`.
/// Returns how far it got and whether the socket was full.
fn send_until_full(
    socket: &OwnedFd,
    pieces: &[Piece],
    (mut i, mut off): (usize, usize),
) -> io::Result<((usize, usize), bool)> {
    const IOV_MAX: usize = 1024;
    while i < pieces.len() {
        let n = match &pieces[i] {
            Piece::Mem(_) => {
                let mut iov: Vec<libc::iovec> = pieces[i..]
                    .iter()
                    .take(IOV_MAX)
                    .map_while(|p| match p {
                        Piece::Mem(b) => Some(b),
                        Piece::File(_) => None,
                    })
                    .enumerate()
                    .map(|(k, b)| {
                        let b = if k == 0 { &b[off..] } else { &b[..] };
                        libc::iovec {
                            iov_base: b.as_ptr() as *mut libc::c_void,
                            iov_len: b.len(),
                        }
                    })
                    .collect();
                // Bytes followed by a file range (an XLogData header before its WAL) are sent
                // with MSG_MORE: the kernel holds them for the pages `sendfile` adds next, so
                // the header does not go out as a packet of its own.
                let more = matches!(pieces.get(i + iov.len()), Some(Piece::File(_)));
                // SAFETY: a zeroed msghdr is valid (no name, no control data).
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = iov.len() as _;
                let flags = if more { libc::MSG_MORE } else { 0 };
                // SAFETY: every iovec points into a live `Bytes` of `pieces` for its whole
                // length, and sendmsg only reads them.
                unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, flags) }
            }
            Piece::File(r) => {
                let mut pos =
                    libc::off_t::try_from(r.offset + off as u64).map_err(io::Error::other)?;
                // SAFETY: both descriptors are open for the whole call (owned by the caller),
                // and `pos` is a valid place for the kernel to store the new offset.
                unsafe {
                    libc::sendfile(
                        socket.as_raw_fd(),
                        r.file.as_raw_fd(),
                        &mut pos,
                        r.len - off,
                    )
                }
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(((i, off), true)),
                _ => return Err(e),
            }
        }
        if n == 0 {
            // A zero-length piece is never queued, so nothing was sent: for a file, it ended
            // before the range storage vouched for, which is corruption.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a WAL segment file ended before the range being sent",
            ));
        }
        let mut n = n as usize;
        while n > 0 {
            let left = pieces[i].len() - off;
            if n >= left {
                n -= left;
                i += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(((i, off), false))
}

/// Reads a file range into memory, for a writer without a [`FileSocket`].
async fn read_range(range: WalFileRange) -> io::Result<Bytes> {
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; range.len];
        range.file.read_exact_at(&mut buf, range.offset)?;
        Ok(Bytes::from(buf))
    })
    .await
    .map_err(io::Error::other)?
}

async fn drain<W: AsyncWrite + Unpin>(
    mut sink: W,
    files: Option<FileSocket>,
    mut rx: mpsc::Receiver<Command>,
) -> io::Result<()> {
    let files = files.map(FileSender::new).transpose()?;
    let mut batch: Vec<Command> = Vec::with_capacity(MAX_BATCH);
    loop {
        batch.clear();
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            sink.flush().await?;
            let _ = sink.shutdown().await;
            return Ok(());
        }
        // Frames go to `chunks`, written through `sink`, until the first file range; from
        // there on, in order, to `pieces`, sent by the file sender on the blocking pool. So a
        // batch without WAL from files (live streaming, control messages) is written at once
        // from this task, with no hand-off.
        let mut chunks: Vec<Bytes> = Vec::with_capacity(batch.len() * 2);
        let mut pieces: Vec<Piece> = Vec::new();
        for cmd in batch.drain(..) {
            match cmd {
                Command::Write(f) => {
                    let mem = [f.head, f.body].into_iter().filter(|b| !b.is_empty());
                    match (f.file, &files) {
                        (Some(range), Some(_)) => {
                            pieces.extend(mem.map(Piece::Mem));
                            pieces.push(Piece::File(range));
                        }
                        (Some(range), None) => {
                            chunks.extend(mem);
                            chunks.push(read_range(range).await?);
                        }
                        (None, _) if pieces.is_empty() => chunks.extend(mem),
                        (None, _) => pieces.extend(mem.map(Piece::Mem)),
                    }
                }
                Command::Flush(done) => {
                    // Earlier frames of this batch are not written yet; write them first.
                    write_out(&mut sink, files.as_ref(), &mut chunks, &mut pieces).await?;
                    let _ = done.send(());
                }
            }
        }
        write_out(&mut sink, files.as_ref(), &mut chunks, &mut pieces).await?;
    }
}

/// Writes `chunks` through `sink`, then `pieces` through `files`.
async fn write_out<W: AsyncWrite + Unpin>(
    sink: &mut W,
    files: Option<&FileSender>,
    chunks: &mut Vec<Bytes>,
    pieces: &mut Vec<Piece>,
) -> io::Result<()> {
    write_all_vectored(sink, chunks).await?;
    sink.flush().await?;
    if let (Some(files), false) = (files, pieces.is_empty()) {
        files.send(std::mem::take(pieces)).await?;
    }
    Ok(())
}

async fn write_all_vectored<W: AsyncWrite + Unpin>(
    sink: &mut W,
    chunks: &mut Vec<Bytes>,
) -> io::Result<()> {
    let mut first = 0;
    while first < chunks.len() {
        let n = {
            let slices: Vec<IoSlice<'_>> =
                chunks[first..].iter().map(|c| IoSlice::new(c)).collect();
            sink.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the peer stopped accepting data",
            ));
        }
        let mut left = n;
        while left > 0 {
            let c = &mut chunks[first];
            if left >= c.len() {
                left -= c.len();
                first += 1;
            } else {
                c.advance(left);
                left = 0;
            }
        }
    }
    chunks.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Queues `frame`, waiting for room when the queue is full.
    async fn queue(tx: &FrameSender, mut frame: Frame) {
        loop {
            match tx.try_send(frame) {
                Ok(()) => return,
                Err((QueueError::Full, f)) => {
                    frame = f;
                    tx.ready().await;
                }
                Err((QueueError::Closed, _)) => panic!("writer closed"),
            }
        }
    }

    /// Both ends of a loopback TCP connection, the first with TCP_NODELAY as a walsender's.
    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        client.set_nodelay(true).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// A file of `len` bytes whose content names its offsets, and its bytes.
    fn wal_file(len: usize) -> (tempfile::NamedTempFile, Arc<std::fs::File>, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), &bytes).unwrap();
        let file = Arc::new(std::fs::File::open(tmp.path()).unwrap());
        (tmp, file, bytes)
    }

    /// Queues frames of memory and of file ranges, in a pattern that mixes them in every way
    /// within and across batches, and returns the bytes they should put on the wire.
    async fn queue_mixed(tx: FrameSender, file: Arc<std::fs::File>, content: &[u8]) -> Vec<u8> {
        let mut expected = Vec::new();
        let mut offset = 0usize;
        for i in 0..300usize {
            let head = Bytes::from(format!("<{i}>").into_bytes());
            expected.extend_from_slice(&head);
            let frame = if i % 3 == 0 {
                let body = Bytes::from(vec![b'm'; i % 50]);
                expected.extend_from_slice(&body);
                Frame::with_body(head, body)
            } else {
                let len = 1 + (i * 4099) % 150_000;
                let len = len.min(content.len() - offset);
                expected.extend_from_slice(&content[offset..offset + len]);
                let range = WalFileRange {
                    file: file.clone(),
                    offset: offset as u64,
                    len,
                };
                offset = (offset + len) % (content.len() - 200_000);
                Frame::with_file(head, range)
            };
            queue(&tx, frame).await;
        }
        expected
    }

    /// Over a real TCP socket with a reader slower than the writer (so `sendfile` and `sendmsg`
    /// meet a full socket again and again), file ranges and memory arrive in order and whole.
    #[test]
    fn file_ranges_are_sent_with_sendfile_in_order() {
        rt().block_on(async {
            let (_tmp, file, content) = wal_file(4 << 20);
            let (client, mut server) = tcp_pair().await;
            let files = FileSocket::duplicate(&client).unwrap();
            let (tx, drain) = frame_queue_with_files(client, Some(files));
            let writer = tokio::spawn(drain);
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = vec![0u8; 4096];
                loop {
                    // Small reads, yielding between them: the socket stays full.
                    let n = server.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return got;
                    }
                    got.extend_from_slice(&buf[..n]);
                    tokio::task::yield_now().await;
                }
            });
            let expected = queue_mixed(tx, file, &content).await;
            let got = reader.await.unwrap();
            writer.await.unwrap().unwrap();
            assert_eq!(got.len(), expected.len());
            assert!(got == expected, "the bytes differ");
        });
    }

    /// Data segments the kernel has sent on `socket`.
    fn data_segments_sent(socket: &impl AsRawFd) -> u32 {
        // SAFETY: a zeroed tcp_info is valid; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        info.tcpi_data_segs_out
    }

    /// An XLogData header and the file range after it leave in one TCP segment: the header
    /// waits for the pages instead of going out as a small packet of its own.
    #[test]
    fn a_header_and_its_file_range_share_a_segment() {
        rt().block_on(async {
            let (_tmp, file, content) = wal_file(64 << 10);
            let (client, mut server) = tcp_pair().await;
            let files = FileSocket::duplicate(&client).unwrap();
            let probe = files.0.clone();
            let (tx, drain) = frame_queue_with_files(client, Some(files));
            let writer = tokio::spawn(drain);
            let mut expected = Vec::new();
            let before = data_segments_sent(&probe);
            for i in 0..4u64 {
                let head = Bytes::from(format!("header {i}").into_bytes());
                let range = WalFileRange {
                    file: file.clone(),
                    offset: i * 8192,
                    len: 8192,
                };
                expected.extend_from_slice(&head);
                expected.extend_from_slice(&content[i as usize * 8192..(i as usize + 1) * 8192]);
                queue(&tx, Frame::with_file(head, range)).await;
                // Each frame is written alone: wait until the peer has all of it.
                let mut got = vec![0u8; head_and_range(i)];
                server.read_exact(&mut got).await.unwrap();
                assert_eq!(got, expected[expected.len() - got.len()..]);
            }
            let segments = data_segments_sent(&probe) - before;
            drop(tx);
            writer.await.unwrap().unwrap();
            assert_eq!(segments, 4, "one data segment per frame");
        });
    }

    /// A batch of catch-up frames is sent corked: the frames fill whole TCP segments instead
    /// of each ending in a small one (uncorked, a 128 KiB frame is two full loopback segments
    /// and a third of the few bytes left), and the socket is uncorked after the batch, so
    /// nothing is held back.
    #[test]
    fn a_batch_of_file_ranges_fills_whole_segments() {
        rt().block_on(async {
            const FRAMES: usize = 16;
            const LEN: usize = 128 << 10;
            let (_tmp, file, content) = wal_file(FRAMES * LEN);
            let (client, mut server) = tcp_pair().await;
            // Room for the whole batch on both sides, so that one call sends it all: a socket
            // found full ends the call, and the uncorking then sends what it holds.
            let room = libc::c_int::try_from(2 * FRAMES * LEN).unwrap();
            set_int_option(&client, libc::SOL_SOCKET, libc::SO_SNDBUF, room).unwrap();
            set_int_option(&server, libc::SOL_SOCKET, libc::SO_RCVBUF, room).unwrap();
            let files = FileSocket::duplicate(&client).unwrap();
            let probe = files.0.clone();
            let (tx, drain) = frame_queue_with_files(client, Some(files));
            let before = data_segments_sent(&probe);
            // All frames are queued before the writer's task first runs (one thread), so they
            // go out as one batch.
            let mut expected = Vec::new();
            for i in 0..FRAMES {
                let head = Bytes::from(format!("header {i:02}").into_bytes());
                expected.extend_from_slice(&head);
                expected.extend_from_slice(&content[i * LEN..(i + 1) * LEN]);
                let range = WalFileRange {
                    file: file.clone(),
                    offset: (i * LEN) as u64,
                    len: LEN,
                };
                queue(&tx, Frame::with_file(head, range)).await;
            }
            let writer = tokio::spawn(drain);
            let mut got = vec![0u8; expected.len()];
            server.read_exact(&mut got).await.unwrap();
            assert!(got == expected, "the bytes differ");
            let segments = data_segments_sent(&probe) - before;
            let corked = int_option(&*probe, libc::IPPROTO_TCP, libc::TCP_CORK);
            drop(tx);
            writer.await.unwrap().unwrap();
            assert_eq!(corked, 0, "the socket was left corked");
            assert!(
                (segments as usize) < FRAMES * 5 / 2,
                "{segments} data segments for {FRAMES} frames of 128 KiB"
            );
        });
    }

    fn int_option(socket: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        actor_util::get_int_option(socket, level, name).expect("getsockopt")
    }

    /// The length of frame `i` of the test above: its header and 8 KiB.
    fn head_and_range(i: u64) -> usize {
        format!("header {i}").len() + 8192
    }

    /// Without a file socket (TLS), file ranges are read and written from memory.
    #[test]
    fn file_ranges_without_a_file_socket_are_read() {
        rt().block_on(async {
            let (_tmp, file, content) = wal_file(4 << 20);
            let (client, mut server) = tokio::io::duplex(64 << 10);
            let (tx, drain) = frame_queue(client);
            let writer = tokio::spawn(drain);
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                server.read_to_end(&mut got).await.map(|_| got)
            });
            let expected = queue_mixed(tx, file, &content).await;
            let got = reader.await.unwrap().unwrap();
            writer.await.unwrap().unwrap();
            assert!(got == expected, "the bytes differ");
        });
    }

    /// A file shorter than the range storage vouched for ends the writer with an error instead
    /// of sending less than the header announced.
    #[test]
    fn a_short_file_is_an_error() {
        rt().block_on(async {
            let (_tmp, file, _) = wal_file(1000);
            let (client, _server) = tcp_pair().await;
            let files = FileSocket::duplicate(&client).unwrap();
            let (tx, drain) = frame_queue_with_files(client, Some(files));
            let writer = tokio::spawn(drain);
            let range = WalFileRange {
                file,
                offset: 500,
                len: 1000,
            };
            tx.try_send(Frame::with_file(Bytes::from_static(b"h"), range))
                .map_err(|(e, _)| e)
                .unwrap();
            drop(tx);
            let err = writer.await.unwrap().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        });
    }

    #[test]
    fn frames_arrive_in_order_and_whole() {
        rt().block_on(async {
            let (client, mut server) = tokio::io::duplex(1024);
            let (tx, drain) = frame_queue(client);
            let writer = tokio::spawn(drain);
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                server.read_to_end(&mut got).await.map(|_| got)
            });
            let mut expected = Vec::new();
            for i in 0..200u32 {
                let head = Bytes::from(i.to_be_bytes().to_vec());
                let body = Bytes::from(vec![i as u8; (i as usize * 37) % 3000]);
                expected.extend_from_slice(&head);
                expected.extend_from_slice(&body);
                queue(&tx, Frame::with_body(head, body)).await;
            }
            drop(tx);
            let got = reader.await.unwrap().unwrap();
            writer.await.unwrap().unwrap();
            assert_eq!(got, expected);
        });
    }

    #[test]
    fn a_slow_reader_fills_the_queue_and_bounds_it() {
        rt().block_on(async {
            // The reader never reads: the pipe holds 64 KiB, the queue QUEUE_FRAMES frames.
            let (client, _server) = tokio::io::duplex(64 << 10);
            let (tx, drain) = frame_queue(client);
            tokio::spawn(drain);
            let mut queued = 0;
            loop {
                let frame = Frame::new(Bytes::from(vec![0u8; 128 << 10]));
                match tx.try_send(frame) {
                    Ok(()) => queued += 1,
                    Err((QueueError::Full, _)) => break,
                    Err((QueueError::Closed, _)) => panic!("writer closed"),
                }
                // Let the writer take what it can.
                tokio::task::yield_now().await;
                assert!(queued < 10 * QUEUE_FRAMES, "the queue never filled up");
            }
            assert!(queued >= QUEUE_FRAMES);
            assert!(queued <= QUEUE_FRAMES + MAX_BATCH + 1, "queued {queued}");
        });
    }

    /// With a file socket the queue takes FILE_QUEUE_FRAMES frames of file ranges, and no more
    /// while the peer does not read.
    #[test]
    fn a_queue_of_file_ranges_is_longer_and_still_bounded() {
        rt().block_on(async {
            let (_tmp, file, _) = wal_file(1 << 20);
            // The peer never reads: the sockets take a few MiB, the queue the rest.
            let (client, _server) = tcp_pair().await;
            let files = FileSocket::duplicate(&client).unwrap();
            let (tx, drain) = frame_queue_with_files(client, Some(files));
            tokio::spawn(drain);
            let mut queued = 0;
            loop {
                let range = WalFileRange {
                    file: file.clone(),
                    offset: 0,
                    len: 1 << 20,
                };
                match tx.try_send(Frame::with_file(Bytes::from_static(b"h"), range)) {
                    Ok(()) => queued += 1,
                    Err((QueueError::Full, _)) => break,
                    Err((QueueError::Closed, _)) => panic!("writer closed"),
                }
                tokio::task::yield_now().await;
                assert!(queued < 10 * FILE_QUEUE_FRAMES, "the queue never filled up");
            }
            // The writer holds one batch (at most a queue's worth) while the socket is full.
            assert!(queued >= FILE_QUEUE_FRAMES, "queued {queued}");
            assert!(queued <= 2 * FILE_QUEUE_FRAMES + 16, "queued {queued}");
        });
    }

    #[test]
    fn the_last_frame_waits_for_room_behind_a_full_queue() {
        rt().block_on(async {
            let (client, mut server) = tokio::io::duplex(1024);
            let (tx, drain) = frame_queue(client);
            let writer = tokio::spawn(drain);
            let mut expected = Vec::new();
            // Fill the queue while nothing reads: the pipe takes 1 KiB, the queue the rest.
            loop {
                let frame = Frame::new(Bytes::from(vec![expected.len() as u8; 4096]));
                match tx.try_send(frame.clone()) {
                    Ok(()) => expected.extend_from_slice(&frame.head),
                    Err((QueueError::Full, _)) => break,
                    Err((QueueError::Closed, _)) => panic!("writer closed"),
                }
                tokio::task::yield_now().await;
            }
            expected.extend_from_slice(b"last words");
            let last = tokio::spawn(tx.send_last(Frame::new(Bytes::from_static(b"last words"))));
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            last.await.unwrap().unwrap();
            writer.await.unwrap().unwrap();
            assert!(got == expected, "the last frame was lost or out of order");
        });
    }

    #[test]
    fn flushed_waits_for_earlier_frames() {
        rt().block_on(async {
            let (client, mut server) = tokio::io::duplex(16);
            let (tx, drain) = frame_queue(client);
            tokio::spawn(drain);
            tx.try_send(Frame::new(Bytes::from_static(b"0123456789abcdefXYZ")))
                .unwrap();
            let flushed = tokio::spawn(tx.flushed());
            let mut got = vec![0u8; 19];
            server.read_exact(&mut got).await.unwrap();
            flushed.await.unwrap().unwrap();
            assert_eq!(&got, b"0123456789abcdefXYZ");
        });
    }

    #[test]
    fn a_broken_socket_ends_the_writer_with_its_error() {
        rt().block_on(async {
            let (client, server) = tokio::io::duplex(16);
            drop(server);
            let (tx, drain) = frame_queue(client);
            let writer = tokio::spawn(drain);
            tx.try_send(Frame::new(Bytes::from_static(b"hello")))
                .unwrap();
            assert!(writer.await.unwrap().is_err());
            let (err, _) = tx
                .try_send(Frame::new(Bytes::from_static(b"x")))
                .unwrap_err();
            assert_eq!(err, QueueError::Closed);
        });
    }
}
