"""Drives rdkv's RESP port as a Redis Cluster: redis-py's `RedisCluster`
finds the slots' owner with CLUSTER SLOTS and routes itself; plain
connections check CLUSTER SLOTS/SHARDS/NODES/KEYSLOT, MOVED and CROSSSLOT.

Usage: redis_cluster_check.py TOKEN LEADER_HOST:PORT FOLLOWER_HOST:PORT [...]
The leader's RESP address first. Exits non-zero with the first mismatch.
"""

import sys

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterCrossSlotError, MovedError
from redis.retry import Retry

SLOTS = 16384


def split(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def plain(address, token, **options):
    host, port = split(address)
    return redis.Redis(
        host=host,
        port=port,
        password=token,
        socket_timeout=15,
        retry=Retry(NoBackoff(), 0),
        **options,
    )


def check_views(r, leader, others):
    """CLUSTER SLOTS, SHARDS, NODES and KEYSLOT as one shard of every slot."""
    # COMMAND as redis-py parses it (RESP3's parser needs every entry's
    # ACL-categories element, as Redis 6 and later send).
    expect("COMMAND knows cluster", r.command()["cluster"]["arity"], -2)
    expect("keyslot foo", r.execute_command("CLUSTER KEYSLOT", "foo"), 12182)
    expect(
        "keyslot of a hash tag",
        r.execute_command("CLUSTER KEYSLOT", "{user1000}.following"),
        r.execute_command("CLUSTER KEYSLOT", "user1000"),
    )
    slots = r.execute_command("CLUSTER SLOTS")
    expect("slot ranges", len(slots), 1)
    first, last, master, *replicas = slots[0]
    expect("range", (first, last), (0, SLOTS - 1))
    name = lambda node: f"{node[0].decode() if isinstance(node[0], bytes) else node[0]}:{node[1]}"
    expect("master", name(master), leader)
    expect("replicas", sorted(name(n) for n in replicas), sorted(others))
    # redis-py parses CLUSTER NODES into {"host:port": {...}}.
    nodes = r.execute_command("CLUSTER NODES")
    expect("nodes", sorted(nodes), sorted([leader, *others]))
    expect("master flag", "master" in nodes[leader]["flags"], True)
    expect("master's slots", nodes[leader]["slots"], [["0", str(SLOTS - 1)]])
    for other in others:
        expect(f"{other} is a replica", "slave" in nodes[other]["flags"], True)
        expect(f"{other}'s master", nodes[other]["master_id"], nodes[leader]["node_id"])
    shards = r.execute_command("CLUSTER SHARDS")
    expect("shards", len(shards), 1)


def check_cluster_client(startup, token):
    rc = RedisCluster(
        startup_nodes=[ClusterNode(*split(a)) for a in startup],
        password=token,
        socket_timeout=15,
        retry=Retry(NoBackoff(), 0),
    )
    for i in range(200):
        expect(f"set {i}", rc.set(f"cluster-key-{i}", f"v{i}"), True)
    for i in range(200):
        expect(f"get {i}", rc.get(f"cluster-key-{i}"), f"v{i}".encode())
    rc.delete("cluster-counter")
    expect("incr", rc.incr("cluster-counter"), 1)
    expect("same-slot mset", rc.mset({"{tag}a": "1", "{tag}b": "2"}), True)
    expect("same-slot mget", rc.mget("{tag}a", "{tag}b"), [b"1", b"2"])
    rc.close()


def check_opted_in(leader, follower, token):
    """A connection that asked CLUSTER SLOTS gets Redis Cluster's rules."""
    r = plain(follower, token)
    expect("mset across slots, not opted in", r.mset({"{a}x": "1", "{b}y": "2"}), True)
    r.execute_command("CLUSTER SLOTS")
    try:
        r.mset({"{a}x": "1", "{b}y": "2"})
        raise AssertionError("mset across slots answered, not CROSSSLOT")
    except ClusterCrossSlotError:
        pass  # redis-py's class for a `-CROSSSLOT` reply
    try:
        r.set("foo", "from a follower")
        raise AssertionError("a write on a follower in cluster mode was not MOVED")
    except MovedError as e:
        expect("moved", str(e), f"12182 {leader}")
    r.close()
    w = plain(leader, token)
    w.execute_command("CLUSTER SLOTS")
    expect("set on the leader in cluster mode", w.set("foo", "bar"), True)
    expect("get on the leader in cluster mode", w.get("foo"), b"bar")
    w.close()


def main():
    token = sys.argv[1]
    leader, *others = sys.argv[2:]
    for address in [leader, *others]:
        check_views(plain(address, token), leader, others)
    check_views(plain(leader, token, protocol=3), leader, others)
    check_cluster_client([others[0]], token)
    check_opted_in(leader, others[0], token)
    print(f"redis-py {redis.__version__} RedisCluster: ok")


if __name__ == "__main__":
    main()
