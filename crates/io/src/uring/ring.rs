//! The primitives every ring here is built from: ring set-up, submit-and-wait, pushing
//! submissions, the user-data encoding of completions, the provided buffer ring and the
//! eventfd that wakes a ring. This is where memory is lent to the kernel, so each type
//! here states who owns what until which completion.

use io_uring::{IoUring, opcode, squeue, types};
use std::alloc::Layout;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::Duration;

/// Times a full submission queue is flushed before pushing gives up.
const PUSH_ATTEMPTS: usize = 64;
/// Alignment the kernel requires of a provided buffer ring's address.
const PAGE_BYTES: usize = 4096;
/// Alignment of receive buffers: a cache line, so buffers do not share lines.
const BUFFER_ALIGN: usize = 64;

/// What a completion is for; the low byte of its user data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Op {
    Recv = 1,
    Send = 2,
    /// An `AsyncCancel`; its own result is not needed.
    Cancel = 3,
    /// The eventfd read that wakes the ring.
    Wake = 4,
    Accept = 5,
}

/// User data: slot key (32 bits) | slot generation (24 bits) | [`Op`] (8 bits). The
/// generation keeps a cancel aimed at a closed connection from hitting a new connection
/// that reused its slot before the cancel was submitted.
pub(super) fn user_data(key: usize, generation: u32, op: Op) -> u64 {
    ((key as u64) << 32) | (u64::from(generation & 0xFF_FFFF) << 8) | op as u64
}

pub(super) fn decode(data: u64) -> (usize, u32, Option<Op>) {
    let op = match data as u8 {
        1 => Some(Op::Recv),
        2 => Some(Op::Send),
        3 => Some(Op::Cancel),
        4 => Some(Op::Wake),
        5 => Some(Op::Accept),
        _ => None,
    };
    ((data >> 32) as usize, ((data >> 8) & 0xFF_FFFF) as u32, op)
}

/// A ring with the flags every ring here uses: a completion queue twice the submission
/// queue and cooperative task running (no inter-processor interrupt to deliver a
/// completion while the worker is busy; it picks them up when it enters the kernel).
pub(super) fn new_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_cqsize(entries.saturating_mul(2))
        .setup_coop_taskrun()
        .build(entries)
}

/// Submits what is queued and waits for at least one completion or `timeout`.
pub(super) fn wait(ring: &IoUring, timeout: Duration) -> io::Result<()> {
    let ts = types::Timespec::from(timeout);
    let args = types::SubmitArgs::new().timespec(&ts);
    match ring.submitter().submit_with_args(1, &args) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ETIME | libc::EINTR | libc::EBUSY)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Submits what is queued without waiting for any completion (a worker with connections
/// ready to run must not sleep); entering the kernel also runs the completions' task work,
/// so those that are due show up in the completion queue.
pub(super) fn submit(ring: &IoUring) -> io::Result<()> {
    match ring.submit() {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Queues `entry`, flushing the submission queue to the kernel when it is full.
///
/// # Safety
/// Every buffer `entry` points to must stay valid, and not be accessed in a way that
/// conflicts with the kernel's use, until the operation's final completion is reaped.
pub(super) unsafe fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
    for _ in 0..PUSH_ATTEMPTS {
        // SAFETY: forwarded from this function's contract.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        match ring.submit() {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("io_uring submission queue stays full"))
}

/// A provided buffer ring: `entries` receive buffers of `buffer_bytes` each, and the ring
/// of descriptors through which they are lent to the kernel, which picks one per receive.
/// A buffer the kernel returned in a completion is ours until [`Self::recycle`] puts it
/// back. The memory is freed only once the ring is unregistered; dropped while still
/// registered (a ring that could not be drained) it is leaked instead.
pub(super) struct ProvidedBuffers {
    ring: NonNull<types::BufRingEntry>,
    ring_layout: Layout,
    data: NonNull<u8>,
    data_layout: Layout,
    entries: u16,
    buffer_bytes: usize,
    /// Our copy of the ring's tail; the kernel reads the shared one.
    tail: u16,
    group: u16,
    registered: bool,
}

// SAFETY: the raw pointers are owned allocations used only by the thread that owns the
// value; moving it to another thread (a worker at start) moves that ownership.
unsafe impl Send for ProvidedBuffers {}

impl ProvidedBuffers {
    pub(super) fn new(
        ring: &IoUring,
        entries: u16,
        buffer_bytes: usize,
        group: u16,
    ) -> io::Result<Self> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        if !entries.is_power_of_two() || buffer_bytes == 0 || u32::try_from(buffer_bytes).is_err() {
            return Err(bad(
                "provided buffers: entries must be a power of two, sizes 32-bit",
            ));
        }
        let ring_layout = Layout::from_size_align(
            usize::from(entries) * std::mem::size_of::<types::BufRingEntry>(),
            PAGE_BYTES,
        )
        .map_err(|_| bad("provided buffer ring too large"))?;
        let data_layout = Layout::from_size_align(
            usize::from(entries)
                .checked_mul(buffer_bytes)
                .ok_or_else(|| bad("provided buffers too large"))?,
            BUFFER_ALIGN,
        )
        .map_err(|_| bad("provided buffers too large"))?;
        // SAFETY: both layouts have non-zero size (entries ≥ 1, buffer_bytes ≥ 1). The ring
        // is zeroed so its tail starts at 0 (no buffer offered) until we publish one.
        let (ring_ptr, data_ptr) = unsafe {
            (
                std::alloc::alloc_zeroed(ring_layout),
                std::alloc::alloc(data_layout),
            )
        };
        let (Some(ring_ptr), Some(data_ptr)) = (
            NonNull::new(ring_ptr.cast::<types::BufRingEntry>()),
            NonNull::new(data_ptr),
        ) else {
            // SAFETY: each non-null pointer came from `alloc*` with this layout.
            unsafe {
                if !ring_ptr.is_null() {
                    std::alloc::dealloc(ring_ptr, ring_layout);
                }
                if !data_ptr.is_null() {
                    std::alloc::dealloc(data_ptr, data_layout);
                }
            }
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut bufs = Self {
            ring: ring_ptr,
            ring_layout,
            data: data_ptr,
            data_layout,
            entries,
            buffer_bytes,
            tail: 0,
            group,
            registered: false,
        };
        // SAFETY: the ring memory is page aligned, holds `entries` descriptors and lives in
        // `bufs`, which frees it only after unregistering (or leaks it, see Drop).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring.as_ptr() as u64,
                entries,
                group,
                0,
            )?;
        }
        bufs.registered = true;
        for bid in 0..entries {
            bufs.recycle(bid);
        }
        Ok(bufs)
    }

    /// The bytes the kernel received into buffer `bid`.
    ///
    /// # Safety
    /// `bid` and `len` must come from a receive completion not yet recycled: the kernel
    /// then neither owns nor writes that buffer until [`Self::recycle`].
    pub(super) unsafe fn received(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.entries || len > self.buffer_bytes {
            return None;
        }
        // SAFETY: the range lies inside the data allocation (checked above), was
        // initialised by the kernel's receive, and the caller guarantees the kernel does
        // not write it while the returned borrow (tied to &self) lives.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.data.as_ptr().add(usize::from(bid) * self.buffer_bytes),
                len,
            )
        })
    }

    /// Lends buffer `bid` to the kernel again (appends it at the ring's tail).
    pub(super) fn recycle(&mut self, bid: u16) {
        if bid >= self.entries {
            return;
        }
        let index = usize::from(self.tail & (self.entries - 1));
        // SAFETY: `index` < entries, so the descriptor lies inside the ring allocation.
        // The kernel reads descriptors only between its head and the published tail, and
        // this slot is past the published tail until the store below publishes it.
        unsafe {
            let entry = &mut *self.ring.as_ptr().add(index);
            entry.set_addr(self.data.as_ptr().add(usize::from(bid) * self.buffer_bytes) as u64);
            entry.set_len(self.buffer_bytes as u32);
            entry.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field lies in the first descriptor of the live ring allocation,
        // is a naturally aligned u16 and is only accessed atomically by us and the kernel.
        // Release orders the descriptor writes above before the kernel sees the new tail.
        unsafe {
            let tail = types::BufRingEntry::tail(self.ring.as_ptr()).cast_mut();
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }

    /// Withdraws the ring from the kernel so its memory can be freed. The caller must have
    /// reaped the final completion of every receive that selects from this group.
    pub(super) fn unregister(&mut self, ring: &IoUring) {
        if !self.registered {
            return;
        }
        match ring.submitter().unregister_buf_ring(self.group) {
            Ok(()) => self.registered = false,
            Err(e) => {
                tracing::error!(error = %e, "cannot unregister provided buffers; leaking them")
            }
        }
    }
}

impl Drop for ProvidedBuffers {
    fn drop(&mut self) {
        if self.registered {
            // The kernel may still write into these buffers: leaking is the only safe choice.
            return;
        }
        // SAFETY: both pointers came from `alloc*` with these layouts and the kernel no
        // longer references them (unregistered).
        unsafe {
            std::alloc::dealloc(self.ring.as_ptr().cast(), self.ring_layout);
            std::alloc::dealloc(self.data.as_ptr(), self.data_layout);
        }
    }
}

/// An eventfd a ring keeps a read armed on, so other threads can wake it.
pub(super) struct WakeFd {
    pub(super) fd: OwnedFd,
    /// A wake is on its way; later notifies need not write the eventfd again.
    pub(super) pending: AtomicBool,
}

impl WakeFd {
    pub(super) fn new() -> io::Result<Self> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Self {
            fd,
            pending: AtomicBool::new(false),
        })
    }

    /// Wakes the ring unless a wake is already pending.
    pub(super) fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.kick();
        }
    }

    /// Wakes the ring unconditionally (shutdown). A failure means the counter is
    /// saturated, i.e. already readable.
    pub(super) fn kick(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

/// The armed eventfd read of a ring: the 8-byte buffer the kernel writes lives on the heap
/// and is owned here until the read's completion.
pub(super) struct WakeRead {
    pub(super) wake: Arc<WakeFd>,
    pub(super) buf: Box<[u8; 8]>,
    pub(super) armed: bool,
}

impl WakeRead {
    pub(super) fn arm(&mut self, ring: &mut IoUring) -> io::Result<()> {
        let read = opcode::Read::new(
            types::Fd(self.wake.fd.as_raw_fd()),
            self.buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(user_data(0, 0, Op::Wake));
        // SAFETY: `buf` is a heap allocation owned by `self`; it is not read or written
        // until the completion arrives (`armed` tracks it), and the ring owners leak it
        // instead of freeing it when the read could not be drained.
        unsafe { push(ring, &read) }?;
        self.armed = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        let data = user_data(123_456, 0xAB_CDEF, Op::Send);
        assert_eq!(decode(data), (123_456, 0xAB_CDEF, Some(Op::Send)));
        assert_eq!(decode(user_data(0, 0, Op::Wake)).2, Some(Op::Wake));
        assert_eq!(decode(0).2, None);
    }

    /// io_uring works on the development machine; where it does not, the reason is printed
    /// and the engine suite reports its uring runs as skipped.
    #[test]
    fn provided_buffers_cycle_through_the_ring() {
        if let Err(e) = crate::uring_support() {
            // Not `eprintln!`: libtest would capture it and the skip would look like a pass.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED provided_buffers_cycle_through_the_ring: {e}"
            );
            return;
        }
        let ring = new_ring(8).expect("ring");
        let mut bufs = ProvidedBuffers::new(&ring, 4, 32, 7).expect("buffers");
        // Recycling more times than there are entries wraps the tail correctly.
        for round in 0..10u16 {
            bufs.recycle(round % 4);
        }
        // SAFETY: no receive uses group 7, so the kernel never writes these buffers.
        let out_of_range = unsafe { bufs.received(4, 1) };
        assert!(out_of_range.is_none(), "out of range bid");
        // SAFETY: as above.
        let too_long = unsafe { bufs.received(0, 33) };
        assert!(too_long.is_none(), "longer than a buffer");
        bufs.unregister(&ring);
        assert!(!bufs.registered);
    }
}
