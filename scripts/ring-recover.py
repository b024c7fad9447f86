# Measures, for a ring started by `cellcache cluster up`, the time from kill -9 of the
# master of a key until a get of that key through another cell answers the value again.
import socket, subprocess, sys, time, os, signal
base = int(sys.argv[1])
B = sys.argv[2]
def conn(port):
    s = socket.create_connection(("127.0.0.1", port)); s.settimeout(10); return s
def cmd(s, data):
    s.sendall(data); buf = b""
    while not (buf.endswith(b"END\r\n") or buf.endswith(b"STORED\r\n") or b"ERROR" in buf):
        buf += s.recv(65536)
    return buf
c = conn(base)
assert cmd(c, b"set greeting 0 0 5\r\nhello\r\n") == b"STORED\r\n"
# which cell masters it: the one whose ranges show it as master holding 1 item
owner = None
for i in range(3):
    out = subprocess.run([B, "ctl", "ranges", "-s", f"127.0.0.1:{base+i+20000}"], capture_output=True, text=True).stdout
    if out.startswith("RANGE master") and out.split("\n")[0].split()[-1] == "1":
        owner = i
pid = int(subprocess.run([B, "cluster", "pid", str(owner + 1), "--base-port", str(base)], capture_output=True, text=True, check=True).stdout.split()[0])
other = base + (owner + 2) % 3
t0 = time.time()
os.kill(pid, signal.SIGKILL)
errors = 0
while True:
    try:
        r = cmd(conn(other), b"get greeting\r\n")
        if r == b"VALUE greeting 0 5\r\nhello\r\nEND\r\n":
            break
        errors += 1
    except OSError:
        errors += 1
    time.sleep(0.05)
print(f"killed cell {owner+1} (master of the key); readable through 127.0.0.1:{other} after {time.time()-t0:.2f} s, {errors} failed attempts")
