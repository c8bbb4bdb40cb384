"""GETs one key over RESP in a loop (compaction-lease.sh) until SIGTERM, then
prints how many, the errors, the longest wait and the waits over 100 ms.

probe.py HOST PORT
"""
import socket, sys, time, signal
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port)); s.settimeout(30)
stop = False
def term(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, term)
req = b"*2\r\n$3\r\nGET\r\n$8\r\ns0000001\r\n"
slow = []; errors = 0; n = 0; worst = 0.0
while not stop:
    t = time.monotonic(); s.sendall(req)
    buf = b""
    while not (buf.startswith(b"$") and buf.count(b"\r\n") >= 2) and not (buf[:1] in (b"-", b"+", b":") and buf.endswith(b"\r\n")) and not buf.startswith(b"$-1\r\n"):
        chunk = s.recv(65536)
        if not chunk: raise SystemExit("closed")
        buf += chunk
    d = time.monotonic() - t; n += 1
    if buf.startswith(b"-"): errors += 1
    worst = max(worst, d)
    if d > 0.1: slow.append((round(time.time() % 1000, 3), round(d, 3), buf[:60]))
    time.sleep(0.001)
print(f"probe: {n} GETs, {errors} errors, worst {worst*1000:.1f} ms, waits over 100 ms: {slow[:20]}", flush=True)
