//! The `uring` engine: one io_uring per worker thread (thread-per-core), fed by an
//! acceptor ring that deals accepted sockets round-robin — the epoll engine's thread
//! model with readiness replaced by completions.
//!
//! Per worker: a submission/completion ring pair shared with the kernel (seed 002's
//! argument: events delivered through memory both sides see, not one syscall per event),
//! one provided buffer ring registered with the kernel, and per connection one multishot
//! receive (armed once, completes once per arriving segment into a buffer the kernel picks
//! from the buffer ring) and at most one send in flight. Everything a turn of the loop
//! queued goes to the kernel in the one `io_uring_enter` that also waits for the next
//! completions, so a pipelining client costs one syscall per batch, not per request.
//!
//! Why an acceptor ring rather than an `SO_REUSEPORT` listener per worker: as in the epoll
//! engine, the reuseport hash can leave a worker idle when a client opens few connections,
//! and dealing round-robin keeps workers even; cellcache clients hold connections for a
//! long time, so the extra hop (a channel push and an eventfd write per accepted
//! connection) is off the request path. Its ring uses a multishot accept.
//!
//! Receive path: a completion names a provided buffer. When the connection has no leftover
//! input the session parses straight out of that buffer (no copy); only an unconsumed tail
//! is copied into the connection's input, and the buffer goes back to the ring at once.
//! Send path: sessions append to `output`; a send is issued from a second buffer,
//! `sending`, which the connection slot owns and nobody touches until the completion
//! arrives; the two are swapped when `sending` is done, so a session appending never moves
//! memory the kernel is reading. Plain `send` is used: `SendZc` pays a second completion
//! and page pinning per send and only wins for large payloads (roughly ≥ 10 KiB per send),
//! which cache replies rarely are; docs/io-engines.md records this.
//!
//! Backpressure: while pending output is above the high mark the receive is cancelled
//! (a multishot receive cannot be paused) and re-armed when output drains.
//!
//! Ownership rule that makes the `unsafe` sound: every buffer handed to the kernel (the
//! send buffer, the provided buffers and their ring, the eventfd read buffer) is owned by
//! a structure that outlives the operation: a connection slot is freed only after the
//! completions of all its operations arrived (close = cancel, then wait), the buffer ring is
//! unregistered before it is freed, and when a worker cannot drain its ring it leaks these
//! buffers rather than free memory the kernel might still write.
//!
//! Notify and shutdown wake a worker through an eventfd read kept armed in its ring.

use crate::{
    EngineConfig, EngineStats, IoEngineKind, IoError, Notify, Progress, RunningEngine, Service,
    Session, Shutdown, TOO_MANY_CONNECTIONS,
};
use crossbeam_channel::{Receiver, Sender};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use std::alloc::Layout;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// How long a ring waits for completions before running housekeeping (idle sweep,
/// shutdown deadline).
const HOUSEKEEPING_TICK: Duration = Duration::from_millis(500);
/// After an accept error that ended the multishot accept (e.g. EMFILE), wait this long
/// before arming it again, so a persistent error does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Times a full submission queue is flushed before pushing gives up.
const PUSH_ATTEMPTS: usize = 64;
/// Waits for outstanding completions (cancelled operations) when a ring is torn down;
/// past it the buffers those operations use are leaked rather than freed.
const DRAIN_WAITS: usize = 20;
/// Submission queue entries of the acceptor's ring: it has at most two operations.
const ACCEPTOR_RING_ENTRIES: u32 = 8;
/// Buffer group id of a worker's provided buffer ring (one group per ring).
const BUFFER_GROUP: u16 = 0;
/// Alignment the kernel requires of a provided buffer ring's address.
const PAGE_BYTES: usize = 4096;
/// Alignment of receive buffers: a cache line, so buffers do not share lines.
const BUFFER_ALIGN: usize = 64;

/// What a completion is for; the low byte of its user data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
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
fn user_data(key: usize, generation: u32, op: Op) -> u64 {
    ((key as u64) << 32) | (u64::from(generation & 0xFF_FFFF) << 8) | op as u64
}

fn decode(data: u64) -> (usize, u32, Option<Op>) {
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

/// Why io_uring cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UringUnavailableCause {
    /// `kernel.io_uring_disabled` forbids it (2: for everyone; 1: outside
    /// `kernel.io_uring_group`).
    DisabledBySysctl { value: u8 },
    /// `io_uring_setup` returned EPERM: a seccomp profile blocks it (Docker 25+ and
    /// containerd 2 do by default) or an LSM policy denies it.
    NotPermitted,
    /// `io_uring_setup` returned ENOSYS: a kernel built without io_uring, or a seccomp
    /// profile that answers ENOSYS.
    NotImplemented,
    /// The kernel has io_uring but lacks something this engine needs.
    MissingFeature(&'static str),
    /// Ring setup failed for another reason (e.g. ENOMEM from `RLIMIT_MEMLOCK` on kernels
    /// before 5.12).
    SetupFailed(String),
}

impl UringUnavailableCause {
    /// What an operator can do about it.
    pub fn fix(&self) -> &'static str {
        match self {
            Self::DisabledBySysctl { .. } => {
                "set `sysctl kernel.io_uring_disabled=0` (or add the user to kernel.io_uring_group when it is 1), or set io_engine = \"epoll\""
            }
            Self::NotPermitted => {
                "allow io_uring_setup, io_uring_enter and io_uring_register in the container's seccomp profile (docker run --security-opt seccomp=<profile>), or set io_engine = \"epoll\""
            }
            Self::NotImplemented => {
                "use a kernel built with CONFIG_IO_URING, or a seccomp profile that allows the io_uring syscalls, or set io_engine = \"epoll\""
            }
            Self::MissingFeature(_) => "run Linux 6.0 or later, or set io_engine = \"epoll\"",
            Self::SetupFailed(_) => {
                "raise RLIMIT_MEMLOCK (ulimit -l) or io_uring limits, or set io_engine = \"epoll\""
            }
        }
    }
}

impl std::fmt::Display for UringUnavailableCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DisabledBySysctl { value } => {
                write!(f, "disabled by sysctl kernel.io_uring_disabled = {value}")
            }
            Self::NotPermitted => f.write_str(
                "io_uring_setup is not permitted (EPERM): blocked by a seccomp profile or security policy",
            ),
            Self::NotImplemented => f.write_str(
                "io_uring_setup is not implemented (ENOSYS): kernel without io_uring or a seccomp filter",
            ),
            Self::MissingFeature(what) => write!(f, "the kernel lacks {what}"),
            Self::SetupFailed(why) => write!(f, "ring setup failed: {why}"),
        }
    }
}

/// io_uring cannot be used on this host; says why and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("io_uring is unavailable: {cause}; fix: {}", .cause.fix())]
pub struct UringUnavailable {
    pub cause: UringUnavailableCause,
}

impl From<UringUnavailableCause> for UringUnavailable {
    fn from(cause: UringUnavailableCause) -> Self {
        Self { cause }
    }
}

/// Checks that this process may use io_uring with everything the engine needs: the
/// sysctl, ring setup (seccomp shows here), the features and opcodes used, provided buffer
/// rings, and — by doing one — a multishot receive. Costs one small ring and a socket pair.
pub fn uring_support() -> Result<(), UringUnavailable> {
    use UringUnavailableCause as C;
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok())
        .unwrap_or(0);
    if sysctl >= 2 {
        return Err(C::DisabledBySysctl { value: sysctl }.into());
    }
    let mut ring = new_ring(ACCEPTOR_RING_ENTRIES).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) if sysctl == 1 => C::DisabledBySysctl { value: sysctl },
        Some(libc::EPERM) => C::NotPermitted,
        Some(libc::ENOSYS) => C::NotImplemented,
        _ => C::SetupFailed(e.to_string()),
    })?;
    let params = ring.params();
    if !params.is_feature_ext_arg() || !params.is_feature_nodrop() {
        return Err(
            C::MissingFeature("IORING_FEAT_EXT_ARG and IORING_FEAT_NODROP (Linux 5.11)").into(),
        );
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|_| C::MissingFeature("IORING_REGISTER_PROBE (Linux 5.6)"))?;
    for (code, name) in [
        (opcode::RecvMulti::CODE, "IORING_OP_RECV"),
        (opcode::Send::CODE, "IORING_OP_SEND"),
        (opcode::AcceptMulti::CODE, "IORING_OP_ACCEPT"),
        (opcode::AsyncCancel::CODE, "IORING_OP_ASYNC_CANCEL"),
        (opcode::Read::CODE, "IORING_OP_READ"),
    ] {
        if !probe.is_supported(code) {
            return Err(C::MissingFeature(name).into());
        }
    }
    let mut bufs = ProvidedBuffers::new(&ring, 2, 64, BUFFER_GROUP)
        .map_err(|_| C::MissingFeature("provided buffer rings (Linux 5.19)"))?;
    let result = probe_multishot_recv(&mut ring, &mut bufs);
    if result.is_ok() {
        bufs.unregister(&ring);
    }
    result.map_err(Into::into)
}

/// Arms a multishot receive on a socket pair, sends a few bytes and checks they arrive
/// in a provided buffer with the receive still armed; then cancels it and waits for the
/// cancellation, so the buffers can be released.
fn probe_multishot_recv(
    ring: &mut IoUring,
    bufs: &mut ProvidedBuffers,
) -> Result<(), UringUnavailableCause> {
    use UringUnavailableCause as C;
    const MESSAGE: &[u8] = b"probe";
    let missing = C::MissingFeature("multishot receive (Linux 6.0)");
    let (reader, mut writer) =
        std::os::unix::net::UnixStream::pair().map_err(|e| C::SetupFailed(e.to_string()))?;
    let recv = opcode::RecvMulti::new(types::Fd(reader.as_raw_fd()), BUFFER_GROUP)
        .build()
        .user_data(user_data(0, 0, Op::Recv));
    // SAFETY: the receive writes only into provided buffers, which `bufs` owns and keeps
    // registered until this function has seen the receive's final completion (below), or
    // leaks when it has not (ProvidedBuffers::drop while registered).
    unsafe { push(ring, &recv) }.map_err(|e| C::SetupFailed(e.to_string()))?;
    writer
        .write_all(MESSAGE)
        .map_err(|e| C::SetupFailed(e.to_string()))?;
    let mut verdict = Err(missing.clone());
    let mut armed = true;
    let mut cancelled = false;
    for _ in 0..DRAIN_WAITS {
        wait(ring, Duration::from_millis(100)).map_err(|e| C::SetupFailed(e.to_string()))?;
        let completions: Vec<_> = ring
            .completion()
            .map(|c| (c.user_data(), c.result(), c.flags()))
            .collect();
        for (data, result, flags) in completions {
            if decode(data).2 != Some(Op::Recv) {
                continue;
            }
            armed = cqueue::more(flags);
            if let Some(bid) = cqueue::buffer_select(flags) {
                bufs.recycle(bid);
                if usize::try_from(result) == Ok(MESSAGE.len()) && armed {
                    verdict = Ok(());
                }
            }
        }
        if !armed {
            break;
        }
        if !cancelled {
            let cancel = opcode::AsyncCancel::new(user_data(0, 0, Op::Recv))
                .build()
                .user_data(user_data(0, 0, Op::Cancel));
            // SAFETY: a cancel refers to no memory.
            unsafe { push(ring, &cancel) }.map_err(|e| C::SetupFailed(e.to_string()))?;
            cancelled = true;
        }
    }
    if armed {
        return Err(C::SetupFailed("probe receive did not finish".into()));
    }
    verdict
}

/// A ring with the flags every ring here uses: a completion queue twice the submission
/// queue and cooperative task running (no inter-processor interrupt to deliver a
/// completion while the worker is busy; it picks them up when it enters the kernel).
fn new_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_cqsize(entries.saturating_mul(2))
        .setup_coop_taskrun()
        .build(entries)
}

/// Submits what is queued and waits for at least one completion or `timeout`.
fn wait(ring: &IoUring, timeout: Duration) -> io::Result<()> {
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

/// Queues `entry`, flushing the submission queue to the kernel when it is full.
///
/// # Safety
/// Every buffer `entry` points to must stay valid, and not be accessed in a way that
/// conflicts with the kernel's use, until the operation's final completion is reaped.
unsafe fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
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
struct ProvidedBuffers {
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
    fn new(ring: &IoUring, entries: u16, buffer_bytes: usize, group: u16) -> io::Result<Self> {
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
    unsafe fn received(&self, bid: u16, len: usize) -> Option<&[u8]> {
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
    fn recycle(&mut self, bid: u16) {
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
    fn unregister(&mut self, ring: &IoUring) {
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
struct WakeFd {
    fd: OwnedFd,
    /// A wake is on its way; later notifies need not write the eventfd again.
    pending: AtomicBool,
}

impl WakeFd {
    fn new() -> io::Result<Self> {
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
    fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.kick();
        }
    }

    /// Wakes the ring unconditionally (shutdown). A failure means the counter is
    /// saturated, i.e. already readable.
    fn kick(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

/// The armed eventfd read of a ring: the 8-byte buffer the kernel writes lives on the heap
/// and is owned here until the read's completion.
struct WakeRead {
    wake: Arc<WakeFd>,
    buf: Box<[u8; 8]>,
    armed: bool,
}

impl WakeRead {
    fn arm(&mut self, ring: &mut IoUring) -> io::Result<()> {
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

/// Binds `addr` and starts the acceptor ring and `config.worker_threads()` worker rings.
pub fn start<S: Service>(
    addr: SocketAddr,
    config: &EngineConfig,
    service: Arc<S>,
    shutdown: Shutdown,
) -> Result<RunningEngine, IoError> {
    config.validate()?;
    let listener = crate::bind_listener(addr, config.listen_backlog, false)?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| IoError::Listen { addr, source })?;
    let stats = Arc::new(EngineStats::default());
    let mut threads = Vec::new();
    let mut inboxes = Vec::new();
    for id in 0..config.worker_threads() {
        let ring = new_ring(config.uring_queue_entries).map_err(IoError::Poll)?;
        let bufs = ProvidedBuffers::new(
            &ring,
            config.uring_provided_buffers,
            config.read_chunk_bytes,
            BUFFER_GROUP,
        )
        .map_err(IoError::Poll)?;
        let wake = Arc::new(WakeFd::new().map_err(IoError::Poll)?);
        {
            let wake = wake.clone();
            shutdown.register_fn(move || wake.kick());
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let (notify_tx, notify_rx) = crossbeam_channel::unbounded();
        inboxes.push((tx, wake.clone()));
        let worker = Worker {
            id,
            ring,
            bufs,
            conns: slab::Slab::new(),
            next_generation: 0,
            wake: WakeRead {
                wake,
                buf: Box::new([0; 8]),
                armed: false,
            },
            inbox: rx,
            notify_tx,
            notify_rx,
            completions: Vec::new(),
            config: config.clone(),
            service: service.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("cellcache-uring-{id}"))
                .spawn(move || worker.run())
                .map_err(IoError::Spawn)?,
        );
    }
    let wake = Arc::new(WakeFd::new().map_err(IoError::Poll)?);
    {
        let wake = wake.clone();
        shutdown.register_fn(move || wake.kick());
    }
    let acceptor = Acceptor {
        ring: new_ring(ACCEPTOR_RING_ENTRIES).map_err(IoError::Poll)?,
        listener,
        wake: WakeRead {
            wake,
            buf: Box::new([0; 8]),
            armed: false,
        },
        accept_armed: false,
        retry_at: None,
        workers: inboxes,
        next: 0,
        config: config.clone(),
        stats: stats.clone(),
        shutdown,
    };
    threads.push(
        std::thread::Builder::new()
            .name("cellcache-uring-accept".into())
            .spawn(move || acceptor.run())
            .map_err(IoError::Spawn)?,
    );
    tracing::info!(%local_addr, workers = config.worker_threads(), engine = "uring", "listening");
    Ok(RunningEngine {
        engine: IoEngineKind::Uring,
        local_addr,
        stats,
        threads,
    })
}

/// A worker's inbox for accepted sockets and the eventfd that makes it look.
type WorkerInbox = (Sender<(TcpStream, SocketAddr)>, Arc<WakeFd>);

struct Acceptor {
    ring: IoUring,
    listener: TcpListener,
    wake: WakeRead,
    accept_armed: bool,
    /// When to re-arm an accept that ended in an error.
    retry_at: Option<Instant>,
    workers: Vec<WorkerInbox>,
    next: usize,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl Acceptor {
    fn run(mut self) {
        if let Err(e) = self.serve() {
            tracing::error!(error = %e, "acceptor ring failed; no new connections");
        }
        self.finish();
    }

    fn serve(&mut self) -> io::Result<()> {
        self.wake.arm(&mut self.ring)?;
        while !self.shutdown.is_triggered() {
            if !self.accept_armed && self.retry_at.is_none_or(|at| Instant::now() >= at) {
                self.arm_accept()?;
            }
            wait(&self.ring, HOUSEKEEPING_TICK.min(ACCEPT_RETRY_DELAY))?;
            let completions: Vec<_> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (data, result, flags) in completions {
                match decode(data).2 {
                    Some(Op::Accept) => {
                        self.accept_armed = cqueue::more(flags);
                        self.accepted(result);
                        if !self.accept_armed && result < 0 {
                            self.retry_at = Some(Instant::now() + ACCEPT_RETRY_DELAY);
                        }
                    }
                    Some(Op::Wake) => {
                        self.wake.armed = false;
                        self.wake.arm(&mut self.ring)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn arm_accept(&mut self) -> io::Result<()> {
        let accept = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(0, 0, Op::Accept));
        // SAFETY: a multishot accept without an address buffer refers to no memory.
        unsafe { push(&mut self.ring, &accept) }?;
        self.accept_armed = true;
        self.retry_at = None;
        Ok(())
    }

    fn accepted(&mut self, result: i32) {
        if result < 0 {
            let e = io::Error::from_raw_os_error(-result);
            tracing::warn!(error = %e, "accept failed");
            return;
        }
        // SAFETY: a successful accept completion's result is a new descriptor that nothing
        // else owns; wrapping it makes it closed exactly once.
        let mut stream = unsafe { TcpStream::from_raw_fd(result) };
        if !self.stats.try_open(self.config.max_connections) {
            // Best effort, like memcached; non-blocking so the acceptor never waits.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write(TOO_MANY_CONNECTIONS);
            tracing::warn!(
                max = self.config.max_connections,
                "connection refused: limit reached"
            );
            return;
        }
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(_) => {
                // The client is already gone.
                self.stats.closed();
                return;
            }
        };
        if self.config.tcp_nodelay {
            let _ = stream.set_nodelay(true);
        }
        let (tx, wake) = &self.workers[self.next % self.workers.len()];
        self.next = self.next.wrapping_add(1);
        if tx.send((stream, peer)).is_err() {
            self.stats.closed();
            return;
        }
        wake.wake();
    }

    /// Cancels the accept and the wake read and waits for their completions, closing any
    /// socket accepted meanwhile; leaks the wake buffer if the ring cannot be drained.
    fn finish(mut self) {
        for (armed, op) in [(self.accept_armed, Op::Accept), (self.wake.armed, Op::Wake)] {
            if armed {
                let cancel = opcode::AsyncCancel::new(user_data(0, 0, op))
                    .build()
                    .user_data(user_data(0, 0, Op::Cancel));
                // SAFETY: a cancel refers to no memory.
                if unsafe { push(&mut self.ring, &cancel) }.is_err() {
                    break;
                }
            }
        }
        for _ in 0..DRAIN_WAITS {
            if !self.accept_armed && !self.wake.armed {
                break;
            }
            if wait(&self.ring, HOUSEKEEPING_TICK).is_err() {
                break;
            }
            let completions: Vec<_> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (data, result, flags) in completions {
                match decode(data).2 {
                    Some(Op::Accept) => {
                        self.accept_armed = cqueue::more(flags);
                        if result >= 0 {
                            // SAFETY: a fresh descriptor from accept, owned by nobody else.
                            drop(unsafe { OwnedFd::from_raw_fd(result) });
                        }
                    }
                    Some(Op::Wake) => self.wake.armed = false,
                    _ => {}
                }
            }
        }
        if self.wake.armed {
            tracing::error!("acceptor ring did not drain; leaking its wake buffer");
            std::mem::forget(std::mem::replace(&mut self.wake.buf, Box::new([0; 8])));
        }
        tracing::debug!("acceptor stopped; listener closed");
    }
}

/// One connection as a worker sees it. Freed only when `closed` and no operation of it is
/// in flight (`recv_armed`, `send_inflight` both false).
struct Conn<S> {
    stream: TcpStream,
    session: S,
    generation: u32,
    /// Received, unconsumed bytes: `input[input_start..]`.
    input: Vec<u8>,
    input_start: usize,
    /// Replies the session appended, not yet handed to the kernel.
    output: Vec<u8>,
    /// Replies handed to the kernel: `sending[sent..]` is in flight or next. Not touched
    /// while `send_inflight`.
    sending: Vec<u8>,
    sent: usize,
    recv_armed: bool,
    recv_cancelled: bool,
    send_inflight: bool,
    send_cancelled: bool,
    /// Input may hold a request the session has not been offered yet.
    unprocessed: bool,
    eof: bool,
    /// The session asked to close once output is written.
    closing: bool,
    /// The socket failed (or must be abandoned): close without writing more.
    dead: bool,
    /// `on_close` ran; waiting for in-flight operations before freeing the slot.
    closed: bool,
    last_active: Instant,
}

impl<S: Session> Conn<S> {
    fn pending_output(&self) -> usize {
        self.sending.len() - self.sent + self.output.len()
    }

    fn has_room(&self, config: &EngineConfig) -> bool {
        self.pending_output() < config.output_buffer_high_bytes
    }

    fn apply(&mut self, progress: Progress, offered: usize) -> usize {
        self.unprocessed = progress.output_full;
        self.closing |= progress.close;
        progress.consumed.min(offered)
    }

    /// Takes bytes of a receive completion. With no leftover input the session parses
    /// them in place; whatever it leaves is copied into `input`.
    fn receive(&mut self, data: &[u8], config: &EngineConfig) {
        self.last_active = Instant::now();
        if self.closing || self.dead || self.closed {
            return;
        }
        if self.input_start == self.input.len() && self.has_room(config) {
            self.input.clear();
            self.input_start = 0;
            let progress =
                self.session
                    .on_input(data, &mut self.output, config.output_buffer_high_bytes);
            let consumed = self.apply(progress, data.len());
            self.input.extend_from_slice(&data[consumed..]);
        } else {
            self.input.extend_from_slice(data);
            self.unprocessed = true;
        }
    }

    /// Offers unconsumed input to the session when it has something new and room.
    fn handle(&mut self, config: &EngineConfig) {
        if self.dead || self.closing || !self.unprocessed || !self.has_room(config) {
            return;
        }
        if self.input_start == self.input.len() {
            self.unprocessed = false;
            return;
        }
        let offered = self.input.len() - self.input_start;
        let progress = self.session.on_input(
            &self.input[self.input_start..],
            &mut self.output,
            config.output_buffer_high_bytes,
        );
        self.input_start += self.apply(progress, offered);
        if self.input_start == self.input.len() {
            self.input.clear();
            self.input_start = 0;
        } else if self.input_start > self.input.len() / 2 {
            self.input.drain(..self.input_start);
            self.input_start = 0;
        }
    }

    fn shrink_if_idle(&mut self, keep: usize) {
        if self.input_start == self.input.len() && self.input.capacity() > keep {
            self.input = Vec::new();
            self.input_start = 0;
        }
        if self.output.is_empty() && self.output.capacity() > keep {
            self.output = Vec::new();
        }
        if !self.send_inflight && self.sent == self.sending.len() && self.sending.capacity() > keep
        {
            self.sending = Vec::new();
            self.sent = 0;
        }
    }
}

struct Worker<S: Service> {
    id: usize,
    ring: IoUring,
    bufs: ProvidedBuffers,
    conns: slab::Slab<Conn<S::Session>>,
    next_generation: u32,
    wake: WakeRead,
    inbox: Receiver<(TcpStream, SocketAddr)>,
    /// (slot, generation) of connections whose [`Notify`] fired.
    notify_tx: Sender<(usize, u32)>,
    notify_rx: Receiver<(usize, u32)>,
    /// Reused buffer for one batch of completions.
    completions: Vec<(u64, i32, u32)>,
    config: EngineConfig,
    service: Arc<S>,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl<S: Service> Worker<S> {
    fn run(mut self) {
        if let Err(e) = self.serve() {
            tracing::error!(worker = self.id, error = %e, "io_uring worker failed; closing its connections");
            self.abandon_all();
        }
        self.finish();
    }

    fn serve(&mut self) -> io::Result<()> {
        self.wake.arm(&mut self.ring)?;
        let mut last_sweep = Instant::now();
        let mut stop_deadline: Option<Instant> = None;
        let mut forced = false;
        loop {
            if self.shutdown.is_triggered() {
                let deadline = match stop_deadline {
                    Some(deadline) => deadline,
                    None => {
                        // Stop reading; let every connection finish what it received.
                        self.adopt_new()?;
                        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
                        for key in keys {
                            self.advance(key)?;
                        }
                        *stop_deadline.insert(Instant::now() + self.config.shutdown_grace())
                    }
                };
                if self.conns.is_empty() {
                    return Ok(());
                }
                if !forced && Instant::now() >= deadline {
                    forced = true;
                    self.abandon_all();
                }
                if forced && Instant::now() >= deadline + self.config.shutdown_grace() {
                    return Err(io::Error::other("cancelled operations did not complete"));
                }
            }
            wait(&self.ring, HOUSEKEEPING_TICK)?;
            self.completions.clear();
            self.completions.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            let completions = std::mem::take(&mut self.completions);
            for &(data, result, flags) in &completions {
                self.complete(data, result, flags)?;
            }
            self.completions = completions;
            if last_sweep.elapsed() >= HOUSEKEEPING_TICK {
                self.housekeeping()?;
                last_sweep = Instant::now();
            }
        }
    }

    fn complete(&mut self, data: u64, result: i32, flags: u32) -> io::Result<()> {
        let (key, generation, op) = decode(data);
        match op {
            Some(Op::Wake) => {
                self.wake.armed = false;
                self.wake.wake.pending.store(false, Ordering::Release);
                self.wake.arm(&mut self.ring)?;
                self.adopt_new()?;
                self.run_notified()?;
            }
            Some(Op::Recv) => self.received(key, generation, result, flags)?,
            Some(Op::Send) => self.sent(key, generation, result)?,
            Some(Op::Cancel | Op::Accept) | None => {}
        }
        Ok(())
    }

    fn received(&mut self, key: usize, generation: u32, result: i32, flags: u32) -> io::Result<()> {
        let buffer = cqueue::buffer_select(flags);
        let Self {
            conns,
            bufs,
            config,
            stats,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key).filter(|c| c.generation == generation) else {
            // Cannot happen (slots outlive their operations), but never lose a buffer.
            if let Some(bid) = buffer {
                bufs.recycle(bid);
            }
            return Ok(());
        };
        conn.recv_armed = cqueue::more(flags);
        if !conn.recv_armed {
            conn.recv_cancelled = false;
        }
        match result {
            n if n > 0 => {
                let len = n as usize;
                stats.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                match buffer {
                    Some(bid) => {
                        // SAFETY: `bid` and `len` come from this completion and the buffer
                        // is recycled only after the borrow ends.
                        match unsafe { bufs.received(bid, len) } {
                            Some(data) => conn.receive(data, config),
                            None => conn.dead = true,
                        }
                        bufs.recycle(bid);
                    }
                    None => conn.dead = true,
                }
                if !conn.dead && conn.input.len() - conn.input_start > config.input_buffer_max_bytes
                {
                    stats.input_overflows.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("client exceeded input_buffer_max_bytes; disconnecting");
                    conn.dead = true;
                }
            }
            0 => conn.eof = true,
            n if n == -libc::ENOBUFS || n == -libc::ECANCELED => {
                // Out of buffers (re-armed below once they are back) or our own cancel.
                if let Some(bid) = buffer {
                    bufs.recycle(bid);
                }
            }
            _ => conn.dead = true,
        }
        self.advance(key)
    }

    fn sent(&mut self, key: usize, generation: u32, result: i32) -> io::Result<()> {
        let Some(conn) = self
            .conns
            .get_mut(key)
            .filter(|c| c.generation == generation)
        else {
            return Ok(());
        };
        conn.send_inflight = false;
        conn.send_cancelled = false;
        if result > 0 {
            let n = result as usize;
            conn.sent = (conn.sent + n).min(conn.sending.len());
            self.stats
                .bytes_written
                .fetch_add(n as u64, Ordering::Relaxed);
        } else {
            conn.dead = true;
        }
        self.advance(key)
    }

    /// Moves connection `key` forward after anything changed: runs the session, issues the
    /// next send, arms or cancels the receive, and closes and frees the slot when done.
    fn advance(&mut self, key: usize) -> io::Result<()> {
        let stopping = self.shutdown.is_triggered();
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let fd = types::Fd(conn.stream.as_raw_fd());
        let generation = conn.generation;
        if !conn.closed {
            conn.handle(&self.config);
        }
        if !conn.closed && !conn.dead && !conn.send_inflight {
            if conn.sent == conn.sending.len() {
                conn.sending.clear();
                conn.sent = 0;
                std::mem::swap(&mut conn.sending, &mut conn.output);
            }
            if conn.sent < conn.sending.len() {
                let rest = &conn.sending[conn.sent..];
                let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
                let send = opcode::Send::new(fd, rest.as_ptr(), len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(user_data(key, generation, Op::Send));
                // SAFETY: `sending` is owned by the slot, which is not freed while
                // `send_inflight`, and is neither written nor reallocated until the
                // send's completion clears `send_inflight` (sessions write `output`).
                unsafe { push(&mut self.ring, &send) }?;
                conn.send_inflight = true;
            }
        }
        let want_recv = !conn.closed
            && !conn.dead
            && !conn.eof
            && !conn.closing
            && !stopping
            && conn.has_room(&self.config);
        if want_recv && !conn.recv_armed {
            let recv = opcode::RecvMulti::new(fd, BUFFER_GROUP)
                .build()
                .user_data(user_data(key, generation, Op::Recv));
            // SAFETY: the receive writes only into provided buffers, owned by `self.bufs`,
            // which stays registered until every receive's final completion was reaped.
            unsafe { push(&mut self.ring, &recv) }?;
            conn.recv_armed = true;
            conn.recv_cancelled = false;
        }
        let flushed = !conn.send_inflight && conn.pending_output() == 0;
        let done = conn.dead
            || (flushed && (conn.closing || ((conn.eof || stopping) && !conn.unprocessed)));
        if done && !conn.closed {
            conn.closed = true;
            conn.session.on_close();
            self.stats.closed();
        }
        let mut cancels = Vec::new();
        if conn.recv_armed && !conn.recv_cancelled && (conn.closed || !want_recv) {
            conn.recv_cancelled = true;
            cancels.push(user_data(key, generation, Op::Recv));
        }
        if conn.send_inflight && !conn.send_cancelled && conn.closed {
            conn.send_cancelled = true;
            cancels.push(user_data(key, generation, Op::Send));
        }
        let free = conn.closed && !conn.recv_armed && !conn.send_inflight;
        for target in cancels {
            let cancel = opcode::AsyncCancel::new(target)
                .build()
                .user_data(user_data(key, generation, Op::Cancel));
            // SAFETY: a cancel refers to no memory.
            unsafe { push(&mut self.ring, &cancel) }?;
        }
        if free {
            // No operation references the slot any more: closing the socket is safe.
            self.conns.remove(key);
        }
        Ok(())
    }

    fn adopt_new(&mut self) -> io::Result<()> {
        while let Ok((stream, peer)) = self.inbox.try_recv() {
            if self.shutdown.is_triggered() {
                self.stats.closed();
                continue;
            }
            let key = self.conns.vacant_key();
            let generation = self.next_generation;
            self.next_generation = self.next_generation.wrapping_add(1) & 0xFF_FFFF;
            let notify = {
                let (tx, wake) = (self.notify_tx.clone(), self.wake.wake.clone());
                Notify::new(move || {
                    if tx.send((key, generation)).is_ok() {
                        wake.wake();
                    }
                })
            };
            self.conns.insert(Conn {
                session: self.service.open(peer, notify),
                stream,
                generation,
                input: Vec::new(),
                input_start: 0,
                output: Vec::new(),
                sending: Vec::new(),
                sent: 0,
                recv_armed: false,
                recv_cancelled: false,
                send_inflight: false,
                send_cancelled: false,
                unprocessed: false,
                eof: false,
                closing: false,
                dead: false,
                closed: false,
                last_active: Instant::now(),
            });
            self.advance(key)?;
        }
        Ok(())
    }

    /// Lets notified sessions emit what became ready. Stale entries (closed connection,
    /// reused slot) are skipped by the generation check.
    fn run_notified(&mut self) -> io::Result<()> {
        while let Ok((key, generation)) = self.notify_rx.try_recv() {
            let budget = self.config.output_buffer_high_bytes;
            let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| c.generation == generation && !c.closed)
            else {
                continue;
            };
            let progress = conn.session.on_notify(&mut conn.output, budget);
            conn.closing |= progress.close;
            conn.unprocessed = conn.input_start < conn.input.len();
            self.advance(key)?;
        }
        Ok(())
    }

    fn housekeeping(&mut self) -> io::Result<()> {
        let keep = self.config.idle_buffer_keep_bytes;
        let idle_limit = self.config.idle_timeout();
        let mut expired = Vec::new();
        for (key, conn) in self.conns.iter_mut() {
            conn.shrink_if_idle(keep);
            if let Some(limit) = idle_limit {
                if !conn.closed
                    && conn.last_active.elapsed() >= limit
                    && conn.pending_output() == 0
                    && !conn.send_inflight
                {
                    conn.dead = true;
                    expired.push(key);
                }
            }
        }
        for key in expired {
            self.stats.idle_kicks.fetch_add(1, Ordering::Relaxed);
            self.advance(key)?;
        }
        Ok(())
    }

    /// Marks every connection dead (close without writing more) and issues the cancels.
    fn abandon_all(&mut self) {
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.dead = true;
            }
            if let Err(e) = self.advance(key) {
                tracing::error!(worker = self.id, error = %e, "cannot cancel a connection's operations");
            }
        }
    }

    /// Cancels the wake read, waits until no operation is in flight, then releases the
    /// provided buffers. Whatever the kernel may still use after the wait is leaked.
    fn finish(mut self) {
        if self.wake.armed {
            let cancel = opcode::AsyncCancel::new(user_data(0, 0, Op::Wake))
                .build()
                .user_data(user_data(0, 0, Op::Cancel));
            // SAFETY: a cancel refers to no memory.
            if let Err(e) = unsafe { push(&mut self.ring, &cancel) } {
                tracing::error!(worker = self.id, error = %e, "cannot cancel the wake read");
            }
        }
        for _ in 0..DRAIN_WAITS {
            if self.conns.is_empty() && !self.wake.armed {
                break;
            }
            if wait(&self.ring, HOUSEKEEPING_TICK).is_err() {
                break;
            }
            self.completions.clear();
            self.completions.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            let completions = std::mem::take(&mut self.completions);
            for &(data, result, flags) in &completions {
                if decode(data).2 == Some(Op::Wake) {
                    self.wake.armed = false;
                } else if self.complete(data, result, flags).is_err() {
                    break;
                }
            }
        }
        if self.conns.is_empty() && !self.wake.armed {
            self.bufs.unregister(&self.ring);
        } else {
            tracing::error!(
                worker = self.id,
                connections = self.conns.len(),
                "io_uring operations still in flight at exit; leaking their buffers"
            );
            std::mem::forget(std::mem::take(&mut self.conns));
            std::mem::forget(std::mem::replace(&mut self.wake.buf, Box::new([0; 8])));
        }
        tracing::debug!(worker = self.id, "worker stopped");
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

    #[test]
    fn unavailable_error_names_cause_and_fix() {
        let e = UringUnavailable::from(UringUnavailableCause::NotPermitted);
        let text = e.to_string();
        assert!(text.contains("EPERM"), "{text}");
        assert!(text.contains("seccomp"), "{text}");
        assert!(text.contains("io_engine = \"epoll\""), "{text}");
    }

    /// io_uring works on the development machine; where it does not, the reason is printed
    /// and the engine suite reports its uring runs as skipped.
    #[test]
    fn provided_buffers_cycle_through_the_ring() {
        if let Err(e) = uring_support() {
            eprintln!("SKIPPED provided_buffers_cycle_through_the_ring: {e}");
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
