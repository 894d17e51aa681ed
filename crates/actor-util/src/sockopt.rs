//! Socket options, for the few a connection actor sets on its socket while it runs.

use std::io;
use std::os::fd::AsRawFd;

/// Sets an integer socket option (`setsockopt` with a `c_int` value).
pub fn set_int_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    set_option(socket, level, name, &v.to_ne_bytes())
}

/// The TCP options of keepalive timing, in the order both ends keep them (idle time and
/// interval in seconds, a count of probes, the user timeout in milliseconds), with their names
/// for messages.
pub const KEEPALIVE_TIMING: [(libc::c_int, &str); 4] = [
    (libc::TCP_KEEPIDLE, "TCP_KEEPIDLE"),
    (libc::TCP_KEEPINTVL, "TCP_KEEPINTVL"),
    (libc::TCP_KEEPCNT, "TCP_KEEPCNT"),
    (libc::TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT"),
];

/// Sets each keepalive timing `values` gives (in [`KEEPALIVE_TIMING`]'s order; `None` leaves
/// the socket's). A failure names the option it met; a value beyond a `c_int` is refused as out
/// of range without a call (the kernel would refuse it too).
pub fn set_keepalive_timing(
    socket: &impl AsRawFd,
    values: [Option<u32>; 4],
) -> Result<(), (&'static str, io::Error)> {
    for ((name, what), value) in KEEPALIVE_TIMING.into_iter().zip(values) {
        if let Some(v) = value {
            let v = libc::c_int::try_from(v).map_err(|_| {
                (
                    what,
                    io::Error::new(io::ErrorKind::InvalidInput, "value out of range"),
                )
            })?;
            set_int_option(socket, libc::IPPROTO_TCP, name, v).map_err(|e| (what, e))?;
        }
    }
    Ok(())
}

/// Reads an integer socket option (`getsockopt` into a `c_int`).
pub fn get_int_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the call; `v` and `len` are live and sized for the
    // kernel to write.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets a socket option to `value`, passed as bytes (`setsockopt`), as a string-valued
/// option such as `TCP_CONGESTION` takes it.
pub fn set_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &[u8],
) -> io::Result<()> {
    // SAFETY: the descriptor is open for the call, and `value` is a live slice whose length is
    // passed; the call only reads it.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
