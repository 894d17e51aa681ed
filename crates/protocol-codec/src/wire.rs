//! Byte-level helpers shared by the message decoders and encoders: a bounds-checked cursor over
//! a message body, and a frame writer that back-patches the length.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{CodecError, Result};

/// A cursor over one message body. Every read checks the remaining length first, so a short or
/// lying message becomes a [`CodecError::Malformed`], never a panic.
pub(crate) struct Body {
    buf: Bytes,
    what: &'static str,
}

impl Body {
    pub(crate) fn new(buf: Bytes, what: &'static str) -> Body {
        Body { buf, what }
    }

    fn need(&self, n: usize) -> Result<()> {
        if self.buf.remaining() < n {
            return Err(CodecError::malformed(
                self.what,
                format!("needs {n} more bytes, {} left", self.buf.remaining()),
            ));
        }
        Ok(())
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.remaining()
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn i16(&mut self) -> Result<i16> {
        self.need(2)?;
        Ok(self.buf.get_i16())
    }

    pub(crate) fn i32(&mut self) -> Result<i32> {
        self.need(4)?;
        Ok(self.buf.get_i32())
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    pub(crate) fn i64(&mut self) -> Result<i64> {
        self.need(8)?;
        Ok(self.buf.get_i64())
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        self.need(8)?;
        Ok(self.buf.get_u64())
    }

    /// `n` bytes as a zero-copy slice of the message.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes> {
        self.need(n)?;
        Ok(self.buf.split_to(n))
    }

    /// A NUL-terminated string's bytes, without the NUL.
    pub(crate) fn cstr_bytes(&mut self) -> Result<Bytes> {
        let Some(nul) = self.buf.iter().position(|&b| b == 0) else {
            return Err(CodecError::malformed(
                self.what,
                "missing string terminator",
            ));
        };
        let s = self.buf.split_to(nul);
        self.buf.advance(1);
        Ok(s)
    }

    /// A NUL-terminated UTF-8 string.
    pub(crate) fn cstr(&mut self) -> Result<String> {
        let b = self.cstr_bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| CodecError::malformed(self.what, "string is not valid UTF-8"))
    }

    /// Everything that is left.
    pub(crate) fn rest(self) -> Bytes {
        self.buf
    }

    /// Fails if bytes are left over: PostgreSQL's `pq_getmsgend`.
    pub(crate) fn finish(self) -> Result<()> {
        if self.buf.has_remaining() {
            return Err(CodecError::malformed(
                self.what,
                format!("{} unexpected bytes at the end", self.buf.remaining()),
            ));
        }
        Ok(())
    }
}

/// Appends `s` and a NUL, refusing strings that hold a NUL themselves (they would end early on
/// the wire and desynchronise the peer).
pub(crate) fn put_cstr(dst: &mut BytesMut, s: &[u8], what: &'static str) -> Result<()> {
    if s.contains(&0) {
        return Err(CodecError::encode(what, "string contains a NUL byte"));
    }
    dst.put_slice(s);
    dst.put_u8(0);
    Ok(())
}

/// Writes one typed message: `tag`, an Int32 length that counts itself and the body, and the
/// body written by `body`. On error nothing is left in `dst`.
pub(crate) fn write_frame(
    dst: &mut BytesMut,
    tag: u8,
    body: impl FnOnce(&mut BytesMut) -> Result<()>,
) -> Result<()> {
    let start = dst.len();
    dst.put_u8(tag);
    dst.put_i32(0);
    let written = body(dst).and_then(|()| patch_len(dst, start + 1, "message"));
    if written.is_err() {
        dst.truncate(start);
    }
    written
}

/// Writes the length of everything from `at` to the end of `dst` into the Int32 at `at`.
/// On error the caller removes what it wrote.
pub(crate) fn patch_len(dst: &mut BytesMut, at: usize, what: &'static str) -> Result<()> {
    let len = dst.len() - at;
    let Ok(len) = i32::try_from(len) else {
        return Err(CodecError::encode(
            what,
            format!("{len} bytes do not fit a length field"),
        ));
    };
    dst[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}
