//! The write side of a connection: a bounded queue of frames drained by one tokio task.
//!
//! actix's own `FramedWrite` buffers without bound when the socket is slow (see
//! ACTIX-NOTES §6), so a standby that stops reading would make the walsender hold every byte
//! it wants to send. Here the actor hands frames to a bounded channel instead; the task writes
//! them with vectored I/O, so an XLogData payload read from storage reaches the socket without
//! being copied into an intermediate buffer. When the queue is full the actor stops reading
//! WAL and asks to be woken once there is room again; control messages never wait behind a
//! full queue for long, because the queue drains at the socket's pace.

use std::io::{self, IoSlice};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// One unit of output: a small header (message type, length and any fixed fields) and an
/// optional payload that is written after it without copying.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub head: Bytes,
    pub body: Bytes,
}

impl Frame {
    pub fn new(head: Bytes) -> Frame {
        Frame {
            head,
            body: Bytes::new(),
        }
    }

    pub fn with_body(head: Bytes, body: Bytes) -> Frame {
        Frame { head, body }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
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
    let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
    (FrameSender { tx }, drain(sink, rx))
}

async fn drain<W: AsyncWrite + Unpin>(
    mut sink: W,
    mut rx: mpsc::Receiver<Command>,
) -> io::Result<()> {
    let mut batch: Vec<Command> = Vec::with_capacity(MAX_BATCH);
    loop {
        batch.clear();
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            sink.flush().await?;
            let _ = sink.shutdown().await;
            return Ok(());
        }
        let mut chunks: Vec<Bytes> = Vec::with_capacity(batch.len() * 2);
        for cmd in batch.drain(..) {
            match cmd {
                Command::Write(f) => {
                    if !f.head.is_empty() {
                        chunks.push(f.head);
                    }
                    if !f.body.is_empty() {
                        chunks.push(f.body);
                    }
                }
                Command::Flush(done) => {
                    // Earlier frames of this batch are in `chunks`; write them first.
                    write_all_vectored(&mut sink, &mut chunks).await?;
                    sink.flush().await?;
                    let _ = done.send(());
                }
            }
        }
        write_all_vectored(&mut sink, &mut chunks).await?;
        sink.flush().await?;
    }
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
                let mut frame = Frame::with_body(head, body);
                loop {
                    match tx.try_send(frame) {
                        Ok(()) => break,
                        Err((QueueError::Full, f)) => {
                            frame = f;
                            tx.ready().await;
                        }
                        Err((QueueError::Closed, _)) => panic!("writer closed"),
                    }
                }
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
