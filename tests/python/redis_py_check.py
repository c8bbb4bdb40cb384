"""Drives rdkv's RESP port with redis-py at its default settings (RESP3 in
redis-py 8) or with `protocol=2`, through every node of a cluster.

Usage: redis_py_check.py PROTOCOL TOKEN HOST:PORT [HOST:PORT ...]
PROTOCOL is `default` or `2`. Exits non-zero with the first mismatch.
Retries are off: a retried write could apply twice and hide a fault.
"""

import sys

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def connect(address, token, protocol):
    host, port = address.rsplit(":", 1)
    options = dict(
        host=host,
        port=int(port),
        password=token,
        socket_timeout=15,
        retry=Retry(NoBackoff(), 0),
    )
    if protocol != "default":
        options["protocol"] = int(protocol)
    return redis.Redis(**options)


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def check_node(r, node, resp):
    prefix = f"py{resp}-{node}-"
    key = lambda name: prefix + name
    expect("ping", r.ping(), True)
    expect("set", r.set(key("a"), "1"), True)
    expect("get", r.get(key("a")), b"1")
    expect("get missing", r.get(key("none")), None)
    expect("set nx on a present key", r.set(key("a"), "2", nx=True), None)
    expect("setnx", r.setnx(key("b"), "x"), True)
    expect("getset", r.getset(key("b"), "y"), b"x")
    expect("mset", r.mset({key("c"): "3", key("d"): "4"}), True)
    expect("mget", r.mget([key("c"), key("none"), key("d")]), [b"3", None, b"4"])
    expect("exists", r.exists(key("a"), key("c"), key("none")), 2)
    expect("incr", r.incr(key("n")), 1)
    expect("incrby", r.incrby(key("n"), 41), 42)
    expect("decr", r.decr(key("n")), 41)
    expect("append", r.append(key("s"), "ab"), 2)
    expect("strlen", r.strlen(key("s")), 2)
    expect("delete", r.delete(key("a"), key("none")), 1)
    pipe = r.pipeline(transaction=False)
    for i in range(100):
        pipe.incr(key("piped"))
    pipe.get(key("piped"))
    replies = pipe.execute()
    expect("pipeline", replies, list(range(1, 101)) + [b"100"])
    written = sorted(key(f"k{i:02}") for i in range(30))
    r.mset({k: "v" for k in written})
    expect("keys", sorted(k.decode() for k in r.keys(key("k*"))), written)
    expect("scan_iter", sorted(k.decode() for k in r.scan_iter(match=key("k*"), count=4)), written)
    expect("type", (r.type(written[0]), r.type(key("none"))), (b"string", b"none"))
    expect("unlink", r.unlink(written[0], key("none")), 1)
    expect("rename", r.rename(written[1], key("renamed")), True)
    expect("renamenx onto an existing key", r.renamenx(key("renamed"), written[2]), False)
    expect("copy", r.copy(key("renamed"), key("copied")), True)
    expect("copied", r.mget([key("renamed"), key("copied"), written[1]]), [b"v", b"v", None])
    # MULTI/EXEC through redis-py's transactional pipeline, and WATCH
    # through its optimistic-locking helper.
    tx = r.pipeline()
    tx.set(key("tx"), "1").incr(key("tx")).get(key("tx"))
    expect("multi/exec", tx.execute(), [True, 2, b"2"])

    def double(pipe):
        current = int(pipe.get(key("tx")))
        pipe.multi()
        pipe.set(key("tx"), current * 2)

    expect("watch transaction", r.transaction(double, key("tx")), [True])
    expect("after the watched transaction", r.get(key("tx")), b"4")
    check_expiry(r, key)
    name = f"redis-py-{node}"
    expect("client setname", r.client_setname(name), True)
    expect("client getname", r.client_getname(), name)
    expect("client id is a number", isinstance(r.client_id(), int), True)
    info = r.client_info()
    expect("client info name", info.get("name"), name)
    expect("client info resp", str(info.get("resp")), str(resp))
    expect("client info library", info.get("lib-name"), "redis-py")
    mine = [c for c in r.client_list() if c.get("name") == name]
    expect("client list has this connection", len(mine), 1)
    server = r.info("server")
    expect("info server", server.get("redis_mode"), "standalone")
    expect("dbsize is a number", isinstance(r.dbsize(), int), True)
    expect("config get", r.config_get("appendonly"), {"appendonly": "no"})


def check_expiry(r, key):
    """TTLs: deadlines chosen by the leader, time left counted by the server."""
    expect("set ex", r.set(key("e"), "v", ex=100), True)
    expect("ttl after set ex", 98 <= r.ttl(key("e")) <= 100, True)
    expect("pttl after set ex", 90_000 <= r.pttl(key("e")) <= 100_000, True)
    expect("ttl of a key without one", r.ttl(key("s")), -1)
    expect("ttl of an absent key", r.ttl(key("none")), -2)
    expect("persist", r.persist(key("e")), True)
    expect("persist without a ttl", r.persist(key("e")), False)
    expect("expire", r.expire(key("e"), 50), True)
    expect("expire nx on a key with a ttl", r.expire(key("e"), 60, nx=True), False)
    expect("expire gt", r.expire(key("e"), 60, gt=True), True)
    expect("expire of an absent key", r.expire(key("none"), 10), False)
    expect("expireat", r.expireat(key("e"), 4102444800), True)
    expect("expiretime", r.expiretime(key("e")), 4102444800)
    expect("pexpire", r.pexpire(key("e"), 100_000), True)
    expect("set keepttl", r.set(key("e"), "w", keepttl=True), True)
    expect("keepttl kept the ttl", r.ttl(key("e")) > 0, True)
    expect("set clears the ttl", (r.set(key("e"), "v"), r.ttl(key("e"))), (True, -1))
    # redis-py 8 deprecates its setex() for set(ex=...); the command is still Redis's.
    expect("setex", r.execute_command("SETEX", key("x"), 100, "v"), True)
    expect("getex ex", r.getex(key("x"), ex=30), b"v")
    expect("ttl after getex ex", 1 <= r.ttl(key("x")) <= 30, True)
    expect("getex persist", r.getex(key("x"), persist=True), b"v")
    expect("ttl after getex persist", r.ttl(key("x")), -1)
    expect("getex of an absent key", r.getex(key("none"), ex=10), None)
    expect("getdel", r.getdel(key("x")), b"v")
    expect("getdel of an absent key", r.getdel(key("x")), None)
    expect("expire 0 deletes", r.expire(key("e"), 0), True)
    expect("deleted by expire 0", r.exists(key("e")), 0)
    try:
        r.execute_command("SET", key("e"), "v", "EX", "0")
    except redis.exceptions.ResponseError as e:
        expect("set ex 0", "invalid expire time in 'set' command" in str(e), True)
    else:
        raise AssertionError("SET EX 0 was accepted")
    tx = r.pipeline()
    tx.set(key("tx-ttl"), "v", ex=100).ttl(key("tx-ttl")).pttl(key("tx-ttl"))
    expect("set ex and ttl in multi/exec", tx.execute(), [True, 100, 100_000])


def main():
    protocol, token, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
    resp = 3 if protocol == "default" else int(protocol)
    for node, port in enumerate(ports):
        r = connect(port, token, protocol)
        check_node(r, node, resp)
        r.close()
    # A wrong password is refused at connect with redis-py's own error.
    try:
        connect(ports[0], "wrong", protocol).ping()
    except redis.exceptions.AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong password was accepted")
    print(f"redis-py {redis.__version__} protocol {resp}: ok through {len(ports)} nodes")


if __name__ == "__main__":
    main()
