#!/usr/bin/env python3
"""Runs a command as if inside a container whose seccomp profile blocks io_uring.

Installs a seccomp filter that makes io_uring_setup(2) fail with EPERM (what Docker 25+
and containerd 2 do by default) or, with --errno ENOSYS, with ENOSYS, then execs the
command. Only this process tree is affected. Used to check that the uring tests report
themselves as skipped and that `auto` falls back to epoll:

    python3 crates/io/scripts/without_io_uring.py -- cargo test -p cellcache-io
"""
import ctypes
import errno
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
AUDIT_ARCH_X86_64 = 0xC000003E
NR_IO_URING_SETUP = 425  # x86_64
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06


def main() -> int:
    args = sys.argv[1:]
    err = errno.EPERM
    if args[:1] == ["--errno"]:
        err = getattr(errno, args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    program = [
        (BPF_LD_W_ABS, 0, 0, 4),  # A = seccomp_data.arch
        (BPF_JEQ_K, 0, 3, AUDIT_ARCH_X86_64),  # other arch: allow
        (BPF_LD_W_ABS, 0, 0, 0),  # A = seccomp_data.nr
        (BPF_JEQ_K, 0, 1, NR_IO_URING_SETUP),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | err),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    raw = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(raw)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    os.execvp(args[0], args)
    return 127


if __name__ == "__main__":
    sys.exit(main())
