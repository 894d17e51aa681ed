//! The upstream socket's receive low-water mark (`SO_RCVLOWAT`) while a standby catches up.
//!
//! A walreceiver that reads faster than WAL arrives drains the socket and waits; then every
//! segment the upstream sends wakes it, and on one machine (loopback) the upstream's thread
//! pays for each wake-up. While an XLogData promises much more WAL than is buffered (its
//! `wal_end` is the position the upstream sends up to without waiting for anything), the mark
//! asks the kernel to wake the reader only once [`CATCH_UP_LOW_WATER`] bytes are queued. As
//! soon as less is promised the mark goes back to one byte, so a keepalive, a small record of
//! a synchronous commit or the last bytes of a catch-up are never held back.
//!
//! Why it does not stall: the mark is raised only when the upstream has promised at least
//! twice as many bytes as the mark beyond what the reader holds; a read returns whatever is
//! queued, the mark only delays the readiness signal; the kernel signals anyway when the
//! receive window is nearly closed, at end of stream and on error; and lowering the mark
//! signals at once if enough is queued for the new one. An upstream can still send less than
//! it promised: a PostgreSQL cascading standby that is promoted ends its stream at the switch
//! point, which may lie below the end it advertised. So while the mark is raised, a message
//! that does not arrive within [`LOW_WATER_GRACE`] lowers it (the reader's timeout).

use std::os::fd::RawFd;

use actor_util::set_int_option;

/// The mark while catching up. A guess: a few XLogData messages (128 KiB each from
/// PostgreSQL) per wake-up, well below the read-ahead, so one read takes all that is queued.
pub(crate) const CATCH_UP_LOW_WATER: usize = 256 << 10;

/// How long a reader waits for a message with the mark raised before it lowers the mark. A
/// guess: while catching up a message arrives every fraction of a millisecond, so this only
/// ever fires when the upstream sent less than it promised, and it bounds that wait.
pub(crate) const LOW_WATER_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// The mark of one socket; the socket belongs to the stream that holds this.
#[derive(Debug)]
pub(crate) struct LowWater {
    /// `None` once setting the mark failed (then it is left alone) or for a socket without one.
    fd: Option<RawFd>,
    set: usize,
}

impl LowWater {
    /// The mark of socket `fd`, which the caller keeps open as long as this is used.
    pub(crate) fn new(fd: Option<RawFd>) -> LowWater {
        LowWater { fd, set: 1 }
    }

    /// The mark for `promised` bytes of WAL still to come beyond what the reader holds.
    fn wanted(promised: u64) -> usize {
        if promised >= 2 * CATCH_UP_LOW_WATER as u64 {
            CATCH_UP_LOW_WATER
        } else {
            1
        }
    }

    /// Follows one XLogData: `promised` bytes of WAL are still to come beyond what the reader
    /// holds.
    pub(crate) fn follow(&mut self, promised: u64) {
        let want = Self::wanted(promised);
        let Some(fd) = self.fd else { return };
        if want == self.set {
            return;
        }
        // `fd` is the open socket of the stream that owns this value (see `new`).
        match set_int_option(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            want as libc::c_int,
        ) {
            Ok(()) => self.set = want,
            Err(e) => {
                tracing::debug!(error = %e, "SO_RCVLOWAT not settable; reading without it");
                self.fd = None;
            }
        }
    }

    /// Whether the mark is above one byte.
    pub(crate) fn raised(&self) -> bool {
        self.set > 1
    }

    /// Puts the mark back at one byte: the upstream sent less than it promised.
    pub(crate) fn lower(&mut self) {
        self.follow(0);
    }

    /// The mark last set.
    #[cfg(test)]
    pub(crate) fn current(&self) -> usize {
        self.set
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn kernel_mark(fd: RawFd) -> libc::c_int {
        let mut val: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; `val` and `len` are live and sized.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut val as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        val
    }

    #[test]
    fn raised_only_while_much_is_promised_and_lowered_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = client.as_raw_fd();
        let mut lw = LowWater::new(Some(fd));
        lw.follow(2 * CATCH_UP_LOW_WATER as u64 - 1);
        assert_eq!((lw.current(), kernel_mark(fd)), (1, 1));
        lw.follow(64 << 20);
        assert_eq!(lw.current(), CATCH_UP_LOW_WATER);
        assert_eq!(kernel_mark(fd) as usize, CATCH_UP_LOW_WATER);
        lw.follow(0);
        assert_eq!((lw.current(), kernel_mark(fd)), (1, 1));
    }

    #[tokio::test]
    async fn a_lowered_mark_wakes_a_reader_waiting_for_the_raised_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut lw = LowWater::new(Some(client.as_raw_fd()));
        lw.follow(64 << 20);
        server.write_all(b"short").await.unwrap();
        let mut buf = [0u8; 16];
        // Below the mark: the reader is not woken, whatever the deadline.
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(200), client.read(&mut buf))
                .await;
        assert!(early.is_err(), "woken below the mark");
        // Promised bytes run out: lowering the mark wakes the waiting read at once.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let reader = tokio::spawn(async move {
            let n = client.read(&mut buf).await.unwrap();
            let _ = tx.send(());
            (n, buf)
        });
        tokio::task::yield_now().await;
        lw.follow(0);
        tokio::time::timeout(std::time::Duration::from_secs(10), rx)
            .await
            .expect("the read was not woken by the lowered mark")
            .unwrap();
        let (n, buf) = reader.await.unwrap();
        assert_eq!(&buf[..n], b"short");
    }
}
