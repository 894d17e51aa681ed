//! Decoding never allocates past the codec's limit, measured with a counting allocator: the
//! largest single allocation made while decoding hostile input must stay near the limit,
//! whatever length the input claims. One test in its own binary, so no other thread's
//! allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use protocol_codec::{ClientCodec, ServerCodec, StartupCodec, MAX_STARTUP_PACKET_LEN};
use tokio_util::codec::Decoder;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest allocation `f` makes.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST.store(0, Ordering::Relaxed);
    f();
    LARGEST.load(Ordering::Relaxed)
}

#[test]
fn hostile_lengths_do_not_allocate() {
    const MAX: usize = 64 * 1024;
    // A small xorshift generator: the same inputs on every run.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Half the inputs claim a huge or negative length right away.
        if round % 2 == 0 && input.len() >= 5 {
            let claimed = [i32::MAX, -1, i32::MIN, 1 << 30, (MAX + 6) as i32][round / 2 % 5];
            input[1..5].copy_from_slice(&claimed.to_be_bytes());
            input[..4].copy_from_slice(&claimed.to_be_bytes());
        }
        let bound = 2 * (MAX + 5) + 2 * input.len() + 64;
        let used = largest_allocation(|| {
            let mut src = BytesMut::from(&input[..]);
            while let Ok(Some(_)) = ServerCodec::with_max_message_len(MAX).decode(&mut src) {}
            let mut src = BytesMut::from(&input[..]);
            while let Ok(Some(_)) = ClientCodec::with_max_message_len(MAX).decode(&mut src) {}
            let mut src = BytesMut::from(&input[..]);
            while let Ok(Some(_)) = StartupCodec.decode(&mut src) {}
        });
        assert!(
            used <= bound.max(2 * MAX_STARTUP_PACKET_LEN + 64),
            "allocated {used} bytes decoding {input:02x?}"
        );
    }
}
