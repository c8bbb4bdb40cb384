"""Drives rdkv's RESP port on a cluster of several shards: plain
`redis.Redis` connections to one node are answered for keys of every shard
(MGET/MSET/EXISTS/DEL split per shard; KEYS, SCAN, DBSIZE and FLUSHDB over
every shard), `RedisCluster` routes itself by
CLUSTER SLOTS, and connections in cluster mode get CROSSSLOT and MOVED.

Usage:
  redis_shards_check.py clients SHARDS REPLICAS HOST:PORT...
  redis_shards_check.py bench-keys HOST:PORT
    (after `redis-benchmark --cluster -t set,get`: the keys it wrote,
    `key:{<tag>}:__rand_int__` with a slot's hash tag, are readable)
Exits non-zero with the first mismatch.
"""

import itertools
import string
import sys

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    ClusterCrossSlotError,
    MovedError,
    RedisClusterException,
    ResponseError,
)
from redis.retry import Retry
from redis_cluster_check import expect, split
import redis_cluster_check as cluster_check


def plain(address):
    return cluster_check.plain(address, None)


def name(node):
    host = node[0].decode() if isinstance(node[0], bytes) else node[0]
    return f"{host}:{node[1]}"


def slot_ranges(r):
    """CLUSTER SLOTS as [(first, last, master, replicas)]."""
    ranges = []
    for first, last, master, *replicas in r.execute_command("CLUSTER SLOTS"):
        ranges.append((first, last, name(master), sorted(name(n) for n in replicas)))
    return sorted(ranges)


def range_of(ranges, key):
    slot = key_slot(key.encode())
    return next(i for i, (first, last, _, _) in enumerate(ranges) if first <= slot <= last)


def check_views(addresses, shards, replicas):
    """Every node shows every shard, its leader as master, its other
    replicas as replicas, all with RESP addresses; the nodes agree."""
    views = [slot_ranges(plain(a)) for a in addresses]
    for address, view in zip(addresses, views):
        expect(f"{address}: ranges", len(view), shards)
        for first, last, master, others in view:
            expect(f"{address}: master of {first}-{last} known", master in addresses, True)
            expect(f"{address}: replicas of {first}-{last}", len(others), replicas - 1)
            expect(f"{address}: replicas known", all(o in addresses for o in others), True)
        expect(f"{address}'s view is {addresses[0]}'s", view, views[0])
    nodes = plain(addresses[0]).execute_command("CLUSTER NODES")
    expect("CLUSTER NODES lists every node", sorted(nodes), sorted(addresses))
    expect("CLUSTER SHARDS", len(plain(addresses[1]).execute_command("CLUSTER SHARDS")), shards)
    return views[0]


def keys_per_range(ranges, per_range, prefix):
    """`per_range` keys of each slot range."""
    keys = {i: [] for i in range(len(ranges))}
    for i in itertools.count():
        key = f"{prefix}-{i}"
        found = keys[range_of(ranges, key)]
        if len(found) < per_range:
            found.append(key)
        if all(len(k) == per_range for k in keys.values()):
            return [k for group in keys.values() for k in group]


def check_plain(address, ranges):
    """A plain connection to one node serves keys of every shard."""
    r = plain(address)
    keys = keys_per_range(ranges, 20, "plain")
    for key in keys:
        expect(f"set {key}", r.set(key, f"v-{key}"), True)
    for key in keys:
        expect(f"get {key}", r.get(key), f"v-{key}".encode())
    expect("mget across shards", r.mget(keys), [f"v-{k}".encode() for k in keys])
    pairs = {key: f"m-{key}" for key in reversed(keys)}
    expect("mset across shards", r.mset(pairs), True)
    expect("mget after mset", r.mget(keys), [f"m-{k}".encode() for k in keys])
    expect("exists across shards", r.exists(*keys, "plain-absent"), len(keys))
    expect("del across shards", r.delete(*keys[:9], "plain-absent"), 9)
    expect("mget after del", r.mget(keys[:9]), [None] * 9)
    expect("unlink across shards", r.unlink(*keys[9:]), len(keys) - 9)
    # RENAME reads its source in its destination's shard: keys of two
    # shards are refused, not taken for an absent source.
    source, target = keys_per_range(ranges, 1, "rename")[:2]
    r.set(source, "moving")
    try:
        r.rename(source, target)
        raise AssertionError("RENAME across shards answered")
    except ResponseError as e:
        expect("RENAME across shards refused", "several shards" in str(e), True)
    # KEYS, SCAN, DBSIZE and FLUSHDB span every shard.
    expect("KEYS across shards", r.keys("rename-*"), [source.encode()])
    scanned = list(r.scan_iter(match="rename-*", count=7))
    expect("SCAN across shards", scanned, [source.encode()])
    expect("DBSIZE across shards", r.dbsize(), len(r.keys("*")))
    expect("FLUSHDB across shards", r.flushdb(), True)
    expect("DBSIZE after FLUSHDB", r.dbsize(), 0)
    expect("KEYS after FLUSHDB", r.keys("*"), [])
    r.close()


def check_cluster_client(addresses, ranges):
    """RedisCluster writes and reads 1,000 keys, of every shard."""
    rc = RedisCluster(
        startup_nodes=[ClusterNode(*split(addresses[0]))],
        socket_timeout=15,
        retry=Retry(NoBackoff(), 0),
    )
    keys = [f"cluster-{i}" for i in range(1000)]
    expect("keys of every shard", len({range_of(ranges, k) for k in keys}), len(ranges))
    for key in keys:
        expect(f"set {key}", rc.set(key, f"c-{key}"), True)
    for key in keys:
        expect(f"get {key}", rc.get(key), f"c-{key}".encode())
    try:
        rc.execute_command("MSET", "{a}x", "1", "{b}y", "2")
        raise AssertionError("RedisCluster sent a cross-slot MSET")
    except RedisClusterException:
        pass  # redis-py refuses it before sending
    rc.close()


def check_cluster_mode(addresses, ranges):
    """A connection in cluster mode: CROSSSLOT sent raw, MOVED to the
    master of the key's range, served where that master is."""
    for address in addresses:
        r = plain(address)
        r.execute_command("CLUSTER SLOTS")
        try:
            r.execute_command("MSET", "{a}x", "1", "{b}y", "2")
            raise AssertionError(f"{address}: cross-slot MSET answered, not CROSSSLOT")
        except ClusterCrossSlotError:
            pass  # redis-py's class for a `-CROSSSLOT` reply
        for key in keys_per_range(ranges, 1, "moved"):
            master = ranges[range_of(ranges, key)][2]
            if master == address:
                expect(f"{address}: set {key} at its master", r.set(key, "x"), True)
                continue
            try:
                r.set(key, "x")
                raise AssertionError(f"{address}: {key} of {master} not MOVED")
            except MovedError as e:
                expect(f"{address}: moved", str(e), f"{key_slot(key.encode())} {master}")
        r.close()


def bench_keys(address):
    """The keys redis-benchmark --cluster wrote: `key:{T}:__rand_int__`,
    T the shortest alphanumeric hash tag of a slot (redis's
    crc16_slottable.h), padded with '}' to three characters. Redis 7.0's
    sends each master the key of one of its slots, later ones a random
    slot's: every shard has at least one."""
    alphabet = string.digits + string.ascii_letters
    shortest = {}
    for length in (1, 2, 3):
        for chars in itertools.product(alphabet, repeat=length):
            tag = "".join(chars)
            slot = key_slot(tag.encode())
            if len(shortest.setdefault(slot, [tag])[0]) == length and tag not in shortest[slot]:
                shortest[slot].append(tag)
    candidates = [
        f"key:{{{tag}{'}' * (3 - len(tag))}}}:__rand_int__" for tags in shortest.values() for tag in tags
    ]
    # CLUSTER SLOTS on a connection of its own: it puts its connection in
    # cluster mode, and the MGETs below span slots.
    ranges = slot_ranges(plain(address))
    r = plain(address)
    found = {}
    for at in range(0, len(candidates), 500):
        chunk = candidates[at : at + 500]
        for key, value in zip(chunk, r.mget(chunk)):
            if value is not None:
                found[key] = value
    # One payload of the default 3 bytes (random letters in redis 7).
    expect("benchmark values", [len(v) for v in set(found.values())], [3])
    covered = {range_of(ranges, k) for k in found}
    expect("benchmark keys in every shard", len(covered), len(ranges))
    print(f"redis-benchmark keys readable: {len(found)}")


def main():
    mode, *args = sys.argv[1:]
    if mode == "bench-keys":
        bench_keys(args[0])
        return
    shards, replicas, *addresses = args
    ranges = check_views(addresses, int(shards), int(replicas))
    check_plain(addresses[0], ranges)
    check_cluster_client(addresses, ranges)
    check_cluster_mode(addresses, ranges)
    print(f"redis-py {redis.__version__} over {shards} shards: ok")


if __name__ == "__main__":
    main()
