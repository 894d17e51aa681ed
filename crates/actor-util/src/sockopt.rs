//! Integer socket options, for the few a connection actor sets on its socket while it runs.

use std::io;
use std::os::fd::AsRawFd;

/// Sets an integer socket option (`setsockopt` with a `c_int` value).
pub fn set_int_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the descriptor is open for the call, and `v` is a c_int the call only reads.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
