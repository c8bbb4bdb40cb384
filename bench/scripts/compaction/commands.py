"""A RESP command stream for `redis-cli --pipe` (compaction-lease.sh).

commands.py set PREFIX N SIZE: SET PREFIX0000000.. to SIZE-byte values.
commands.py del PREFIX N STEP: DEL every STEP-th of those keys.
"""
import sys
out = sys.stdout.buffer
what, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def cmd(*args):
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)
if what == "set":
    size = int(sys.argv[4]); value = b"v" * size
    for i in range(n):
        out.write(cmd(b"SET", b"%s%07d" % (prefix.encode(), i), value))
else:
    step = int(sys.argv[4])
    for i in range(0, n, step):
        out.write(cmd(b"DEL", b"%s%07d" % (prefix.encode(), i)))
