#!/usr/bin/env python3
"""Differential check of the request parser against a real memcached.

Generates random command lines from a pool of tricky tokens (bad numbers,
overflowing numbers, long keys, meta flags), sends each (followed by a data
line and `mn`) to a memcached on 127.0.0.1, and compares memcached's error
lines and whether it reached the `mn` with what `cellcache-proto` would do
(`cargo run --example error_lines`). Prints the mismatches.

Usage (from the workspace root, with memcached listening on 127.0.0.1:PORT;
never start it with -A, the generator does not send shutdown but be safe):

    memcached -u nobody -l 127.0.0.1 -p 21211 -d
    python3 crates/proto/differential/compare_with_memcached.py --port 21211 \
        --seed 7 --cases 2500 [--meta]

Known, documented differences (docs/protocol.md, "Differences from
memcached") are filtered: control bytes in keys, `gat` without keys, and for
meta commands the wording/order of CLIENT_ERRORs and flags rejected as unused.
"""
import argparse
import random
import socket
import subprocess

CLASSIC = ["get", "gets", "gat", "gats", "set", "add", "replace", "append", "prepend",
           "cas", "delete", "incr", "decr", "touch", "flush_all", "version", "verbosity"]
META = ["mg", "ms", "md", "ma", "me"]
POOL = ["a", "k", "0", "1", "2", "-1", "+1", "abc", "noreply", "4294967295", "4294967296",
        "18446744073709551615", "18446744073709551616", "9223372036854775807",
        "-9223372036854775808", "2147483648", "-2147483649", "k" * 250, "k" * 251,
        "b", "v", "q", "c", "f", "t", "s", "h", "l", "u", "x", "I", "O", "O1", "Oabc",
        "O" + "a" * 33, "T", "T1", "T-1", "Tx", "N", "N5", "R5", "E5", "C5", "F5",
        "F4294967296", "MS", "ME", "MA", "MP", "MR", "MX", "M", "MEE", "M+", "M-", "MI", "MD",
        "D5", "Dx", "J5", "Jx", "Z", "bXlrZXk=", "!!!", "vv", "0x10"]
FLAG_ERRORS = ("CLIENT_ERROR invalid or duplicate flag", "CLIENT_ERROR invalid flag",
               "CLIENT_ERROR duplicate flag")
SEMANTIC = ("CLIENT_ERROR cannot increment", "SERVER_ERROR", "ERROR: shutdown")


def memcached_reply(port, stream):
    conn = socket.create_connection(("127.0.0.1", port))
    conn.settimeout(0.15)
    conn.sendall(stream)
    out = b""
    try:
        while not out.endswith(b"MN\r\n"):
            data = conn.recv(65536)
            if not data:
                break
            out += data
    except socket.timeout:
        pass
    conn.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=21211)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--meta", action="store_true", help="meta commands instead of classic")
    ap.add_argument("--show", type=int, default=40)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    commands = META if args.meta else CLASSIC
    streams = []
    for _ in range(args.cases):
        tokens = [rng.choice(commands)] + [rng.choice(POOL) for _ in range(rng.randint(0, 7))]
        data = b"xy\r\n" if rng.random() < 0.5 else b""
        streams.append(" ".join(tokens).encode() + b"\r\n" + data + b"mn\r\n")
    ours = subprocess.run(
        ["cargo", "run", "-q", "-p", "cellcache-proto", "--example", "error_lines"],
        input="\n".join(s.hex() for s in streams).encode(), capture_output=True, check=True,
    ).stdout.decode().splitlines()
    mismatches = 0
    for stream, line in zip(streams, ours):
        reply = memcached_reply(args.port, stream)
        noop_ours, joined = line.split("\t")
        errors_ours = [e for e in joined.split("|") if e and e != "QUIT"
                       and not e.startswith("SERVER_ERROR")]
        noop_ours = noop_ours == "true" and "QUIT" not in joined
        lines = reply.decode("latin1").split("\r\n")
        errors_mc = [l for l in lines if l.startswith(("ERROR", "CLIENT_ERROR", "SERVER_ERROR"))
                     and not l.startswith(SEMANTIC)]
        noop_mc = reply.endswith(b"MN\r\n")
        meta = args.meta

        def norm(errors):
            return ["CE" if meta and e.startswith("CLIENT_ERROR")
                    else ("FLAG" if e in FLAG_ERRORS else e) for e in errors]

        stricter = len(errors_ours) == len(errors_mc) + 1 and (meta or stream.startswith(b"gat"))
        if (norm(errors_mc) != norm(errors_ours) or noop_mc != noop_ours) and not stricter:
            mismatches += 1
            if mismatches <= args.show:
                print(repr(stream[:120]))
                print("   memcached:", errors_mc, noop_mc)
                print("   cellcache:", errors_ours, noop_ours)
    print(f"mismatches {mismatches} of {len(streams)}")


if __name__ == "__main__":
    main()
