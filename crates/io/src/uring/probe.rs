//! Detection: can this process use io_uring with everything the engine needs? The answer
//! is a typed error naming the cause (sysctl, seccomp, old kernel, …) and the fix, so
//! `io_engine = "uring"` fails at start with an actionable message and `auto` can fall back.

use super::ring::{Op, ProvidedBuffers, decode, new_ring, push, user_data, wait};
use super::{ACCEPTOR_RING_ENTRIES, BUFFER_GROUP, DRAIN_WAITS};
use io_uring::{IoUring, cqueue, opcode, types};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_error_names_cause_and_fix() {
        let e = UringUnavailable::from(UringUnavailableCause::NotPermitted);
        let text = e.to_string();
        assert!(text.contains("EPERM"), "{text}");
        assert!(text.contains("seccomp"), "{text}");
        assert!(text.contains("io_engine = \"epoll\""), "{text}");
    }
}
