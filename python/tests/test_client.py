"""rdkv.Client against a real 3-node cluster: every call, buffers, batches,
one-sided reads, errors and threads."""

import math
import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest

import rdkv
from local_cluster import MIB, LocalCluster


def fresh(prefix: str) -> bytes:
    """A key no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex}".encode()


def random_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def eventually(check, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.05)


# ---- every call, round trip -------------------------------------------------


def test_put_get_delete_round_trip(client):
    key = fresh("basic")
    assert client.get(key) is None
    version = client.put(key, b"hello")
    assert isinstance(version, int) and version > 0
    assert client.get(key) == b"hello"
    assert client.get_with_version(key) == (b"hello", version)
    assert client.delete(key) is True
    assert client.get(key) is None
    assert client.delete(key) is False


def test_keys_and_values_take_str_bytes_and_buffers(client):
    key = fresh("types")
    client.put(key.decode(), "text é")
    assert client.get(key) == "text é".encode()
    client.put(key, bytearray(b"from a bytearray"))
    assert client.get(key.decode()) == b"from a bytearray"
    client.put(key, memoryview(b"xxfrom a memoryview")[2:])
    assert client.get(key) == b"from a memoryview"
    floats = np.arange(4, dtype=np.float32)
    client.put(key, floats)
    assert client.get(key) == floats.tobytes()
    with pytest.raises(TypeError):
        client.put(key, 12)
    with pytest.raises(TypeError):
        client.get(3.5)


def test_cas_creates_replaces_refuses_and_deletes(client):
    key = fresh("cas")
    created = client.cas(key, None, b"v1")
    assert created and created.succeeded and created.current_value is None
    stale = client.cas(key, created.version + 1000, b"nope")
    assert not stale
    assert stale.current_value == b"v1" and stale.current_version == created.version
    replaced = client.cas(key, created.version, b"v2")
    assert replaced.succeeded and client.get(key) == b"v2"
    assert not client.cas(key, None, b"only if absent").succeeded
    deleted = client.cas(key, replaced.version, None)
    assert deleted.succeeded and client.get(key) is None


def test_mget_and_mput(client):
    keys = [fresh("m") for _ in range(5)]
    version = client.mput({keys[0]: b"a", keys[1]: "b"})
    assert version > 0
    assert client.mput([(keys[2], b"c"), (keys[3], bytearray(b"d"))]) > version
    assert client.mget(keys) == [b"a", b"b", b"c", b"d", None]
    assert client.mget([]) == []


def test_mget_of_more_keys_than_one_request_holds(client):
    prefix = fresh("wide").decode()
    keys = [f"{prefix}-{i:05}".encode() for i in range(1500)]
    for start in range(0, 1500, 500):
        client.mput({k: k[-5:] for k in keys[start:start + 500]})
    assert client.mget(keys) == [k[-5:] for k in keys]


def test_scan_in_key_order_with_bounds_and_limit(client):
    prefix = fresh("scan")
    pairs = {prefix + b"/%03d" % i: b"%d" % i for i in range(30)}
    client.mput(pairs)
    got = client.scan(prefix + b"/", prefix + b"/\xff")
    assert got == sorted(pairs.items())
    assert client.scan(prefix + b"/010", prefix + b"/020") == sorted(pairs.items())[10:20]
    assert len(client.scan(prefix + b"/", limit=7)) == 7


def test_ttl_expire_persist(client):
    key = fresh("ttl")
    assert client.ttl(key) is None
    client.put(key, b"v")
    assert client.ttl(key) == math.inf
    assert client.expire(key, 30) is True
    assert 25 < client.ttl(key) <= 30
    assert client.persist(key) is True
    assert client.ttl(key) == math.inf
    assert client.expire(fresh("absent"), 30) is False
    short = fresh("short")
    client.put(short, b"gone soon", ttl=0.3)
    assert client.get(short) == b"gone soon"
    assert 0 < client.ttl(short) <= 0.3
    eventually(lambda: client.get(short) is None, what="the key's expiry")
    with pytest.raises(ValueError):
        client.put(key, b"v", ttl=0)


def test_ping_properties_and_close(cluster):
    client = cluster.client()
    client.ping()
    client.put(fresh("learn-leader"), b"v")  # writes go to (and learn) the leader
    assert client.leader in cluster.endpoints
    assert set(cluster.endpoints) <= set(client.endpoints)
    assert "rdkv.Client" in repr(client)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.get(b"k")
    with cluster.client() as c:
        c.ping()
    with pytest.raises(RuntimeError):
        c.ping()


def test_bad_arguments_are_value_errors(cluster):
    for kwargs in [
        {"transport": "udp"},
        {"consistency": "eventual"},
        {"timeout": -1},
        {"timeout": float("nan")},
    ]:
        with pytest.raises(ValueError):
            cluster.client(**kwargs)
    with pytest.raises(ValueError):
        rdkv.Client([])


def test_follower_and_linearizable_reads(cluster, client):
    key = fresh("consistency")
    client.put(key, b"v")
    with cluster.client(consistency="linearizable") as strict:
        assert strict.get(key) == b"v"
    with cluster.client(consistency="follower", max_lag=0) as follower:
        assert eventually(lambda: follower.get(key) == b"v", what="a follower read")


# ---- buffers ----------------------------------------------------------------


def test_get_into_four_mib_values_into_numpy_arrays(client):
    for seed in range(3):
        key = fresh("big")
        value = random_bytes(4 * MIB, seed)
        client.put(key, value)
        target = np.zeros(4 * MIB, dtype=np.uint8)
        assert client.get_into(key, target) == 4 * MIB
        assert np.array_equal(target, value)


def test_get_into_fills_the_start_and_leaves_the_rest(client):
    key = fresh("prefix")
    client.put(key, b"abc")
    target = bytearray(b"..........")
    assert client.get_into(key, target) == 3
    assert target == bytearray(b"abc.......")
    view = memoryview(bytearray(5))
    assert client.get_into(key, view[1:]) == 3
    assert bytes(view) == b"\x00abc\x00"


def test_get_into_other_element_types_and_shapes(client):
    key = fresh("floats")
    source = np.linspace(0, 1, 1024, dtype=np.float32).reshape(32, 32)
    client.put(key, source)
    target = np.empty((32, 32), dtype=np.float32)
    assert client.get_into(key, target) == source.nbytes
    assert np.array_equal(target, source)


def test_get_into_missing_key_leaves_the_buffer(client):
    target = bytearray(b"untouched")
    assert client.get_into(fresh("missing"), target) is None
    assert target == bytearray(b"untouched")


def test_get_into_refuses_small_read_only_and_strided_buffers(client):
    key = fresh("refuse")
    client.put(key, b"0123456789")
    with pytest.raises(rdkv.BufferTooSmall) as raised:
        client.get_into(key, bytearray(4))
    assert raised.value.needed == 10 and raised.value.index == 0
    assert raised.value.code == "buffer_too_small"
    assert isinstance(raised.value, rdkv.Error)
    with pytest.raises(TypeError, match="writable"):
        client.get_into(key, b"read-only bytes.....")
    with pytest.raises(BufferError):
        client.get_into(key, np.zeros(40, dtype=np.uint8)[::2])


def test_batch_of_64_values_of_1_mib_put_from_and_got_into_buffers(cluster, client):
    keys = [fresh("batch") for _ in range(64)]
    values = [random_bytes(MIB, 100 + i) for i in range(64)]
    versions = client.batch_put_from(keys, values)
    assert len(versions) == 64 and all(v > 0 for v in versions)
    targets = [np.empty(MIB, dtype=np.uint8) for _ in range(64)]
    assert client.batch_get_into(keys, targets) == [MIB] * 64
    for value, target in zip(values, targets):
        assert np.array_equal(value, target)
    # The same through RPC only: several MGET requests of at most one frame.
    with cluster.client(transport="tcp") as rpc:
        targets = [bytearray(MIB) for _ in range(64)]
        assert rpc.batch_get_into(keys, targets) == [MIB] * 64
        assert all(t == v.tobytes() for t, v in zip(targets, values))


def test_batch_get_into_reports_missing_keys_and_small_buffers(client):
    keys = [fresh("mixed") for _ in range(4)]
    client.batch_put_from([keys[0], keys[2], keys[3]], [b"one", b"three", b"a long value"])
    targets = [bytearray(8) for _ in range(4)]
    with pytest.raises(rdkv.BufferTooSmall) as raised:
        client.batch_get_into(keys, targets)
    assert raised.value.index == 3 and raised.value.needed == 12
    # The others were filled all the same.
    assert targets[0][:3] == b"one" and targets[2][:5] == b"three"
    targets[3] = bytearray(12)
    assert client.batch_get_into(keys, targets) == [3, None, 5, 12]
    assert client.batch_get_into([], []) == []
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        client.batch_get_into(keys[:2], targets[:1])


def test_batch_of_1000_small_values(client):
    keys = [fresh("small") for _ in range(1000)]
    values = [random_bytes(4096, i).tobytes() for i in range(1000)]
    versions = client.batch_put_from(keys, values)
    assert len(set(versions)) == 1  # one request, one log entry
    block = np.empty((1000, 4096), dtype=np.uint8)
    assert client.batch_get_into(keys, list(block)) == [4096] * 1000
    assert all(block[i].tobytes() == values[i] for i in range(1000))


# ---- one-sided reads ----------------------------------------------------------


def one_sided(call, *args, timeout: float = 10.0):
    """A read by a client forced one-sided, repeated while no region can
    serve it right now: `one_sided_unavailable` is retryable (on a loaded
    machine the leader's lease can lapse between two renewals), and such a
    client never falls back to the server. Any other error fails the test.
    A batch refused part way may have counted its first keys as served, so
    a repeated one can count them twice."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call(*args)
        except rdkv.Unavailable as refused:
            if refused.code != "one_sided_unavailable" or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_reads_are_served_one_sided_without_server_gets(cluster):
    with cluster.client(transport="shm") as client:
        keys = [fresh("onesided") for _ in range(8)]
        values = [random_bytes(MIB, 500 + i) for i in range(8)]
        client.batch_put_from(keys, values)
        big = fresh("onesided-big")
        client.put(big, random_bytes(4 * MIB, 7))
        one_sided(client.get, keys[0])  # maps the regions, learns the leader
        before_gets = cluster.total_requests("get", "mget")
        before_served = client.one_sided_stats()["served"]
        target = np.empty(4 * MIB, dtype=np.uint8)
        targets = [np.empty(MIB, dtype=np.uint8) for _ in keys]
        for _ in range(5):
            assert one_sided(client.get_into, big, target) == 4 * MIB
            assert one_sided(client.batch_get_into, keys, targets) == [MIB] * 8
            assert one_sided(client.get, keys[1]) == values[1].tobytes()
            got = one_sided(client.mget, keys[:2])
            assert got == [values[0].tobytes(), values[1].tobytes()]
        assert cluster.total_requests("get", "mget") == before_gets
        # At least every GET asked for (more if a refused batch was repeated).
        assert client.one_sided_stats()["served"] - before_served >= 5 * (1 + 8 + 1 + 2)
    # The counters do move for RPC reads: the check above can fail.
    with cluster.client(transport="tcp") as rpc:
        rpc.get(keys[0])
        assert cluster.total_requests("get", "mget") > before_gets


# ---- errors -------------------------------------------------------------------


def test_value_over_the_limit_is_too_large(client):
    with pytest.raises(rdkv.TooLarge) as raised:
        client.put(fresh("huge"), bytes(4 * MIB + 1))
    assert raised.value.code == "value_too_large"
    assert raised.value.retryable is False


def test_wrong_or_missing_token_is_unauthenticated(cluster):
    for token in ["wrong-token", None]:
        with pytest.raises(rdkv.Unauthenticated) as raised:
            rdkv.Client(cluster.endpoints, token=token)
        assert raised.value.code == "unauthenticated"


def test_no_server_listening_is_unavailable():
    with pytest.raises(rdkv.Unavailable) as raised:
        rdkv.Client(["127.0.0.1:1"], timeout=1.0)
    assert raised.value.code == "connect_failed"
    assert raised.value.retryable is True


def test_full_quota_raises_no_space_and_deletes_make_room():
    with LocalCluster(nodes=1, region_mib=64, extra_args=["--quota-bytes", str(2 * MIB)]) as small:
        with small.client() as client:
            keys = []
            with pytest.raises(rdkv.NoSpace) as raised:
                for i in range(100):
                    key = fresh("fill")
                    client.put(key, bytes(256 * 1024))
                    keys.append(key)
            assert raised.value.code == "no_space"
            assert 0 < len(keys) < 100
            with pytest.raises(rdkv.NoSpace) as batch_failure:
                client.batch_put_from([fresh("more") for _ in range(3)], [bytes(512 * 1024)] * 3)
            assert batch_failure.value.written == 0
            assert client.delete(keys[0])
            client.put(fresh("after-delete"), bytes(128 * 1024))


def test_dead_cluster_raises_unavailable_or_timeout():
    with LocalCluster(nodes=3, region_mib=64) as doomed:
        # By RPC: a one-sided read may still be served from a killed
        # leader's mapped region until the lease it published runs out.
        client = doomed.client(timeout=2.0, transport="tcp")
        key = fresh("dead")
        client.put(key, b"v")
        doomed.kill()
        with pytest.raises((rdkv.Unavailable, rdkv.Timeout)) as read_failure:
            client.get(key)
        assert read_failure.value.retryable
        with pytest.raises((rdkv.Unavailable, rdkv.Timeout, rdkv.OutcomeUnknown)):
            client.put(key, b"w")
        with pytest.raises(rdkv.Unavailable):
            doomed.client(timeout=1.0)


# ---- threads ------------------------------------------------------------------


def test_threads_share_one_client(client):
    failures = []
    threads_n, rounds = 8, 20

    def work(t):
        try:
            target = np.empty(256 * 1024, dtype=np.uint8)
            for r in range(rounds):
                key = f"thread-{t}-{r}-{uuid.uuid4().hex}".encode()
                value = random_bytes(256 * 1024, t * 1000 + r)
                client.put(key, value)
                assert client.get_into(key, target) == value.nbytes
                assert np.array_equal(target, value)
        except Exception as error:  # reported below with the thread
            failures.append((t, repr(error)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_the_gil_is_released_while_a_call_waits():
    """The main thread runs Python while another thread waits in a call on
    a stopped server: were the GIL held through the wait, the main thread
    could not run before the call had returned (give or take the few
    bytecodes between the call's return and its timestamp, hence the
    margin). Compared by the clock, not by a fixed sleep: on a loaded
    machine the main thread may run late, which a sleep mistook for a
    held GIL."""
    with LocalCluster(nodes=1, region_mib=64) as stopped:
        client = stopped.client(transport="tcp", timeout=5.0)
        client.put(b"k", b"v")
        for node in stopped.members:
            node.process.send_signal(signal.SIGSTOP)
        try:
            started = threading.Event()
            outcome, returned_at = [], []

            def call():
                started.set()
                try:
                    client.get(b"k")
                    outcome.append("answered")
                except rdkv.Error as error:
                    outcome.append(type(error).__name__)
                returned_at.append(time.monotonic())

            waiter = threading.Thread(target=call)
            waiter.start()
            started.wait()
            time.sleep(0.2)
            looked_at = time.monotonic()
            waiter.join(timeout=30)
        finally:
            for node in stopped.members:
                node.process.send_signal(signal.SIGCONT)
        assert outcome in (["Timeout"], ["Unavailable"])
        margin_s = 0.1
        assert looked_at < returned_at[0] - margin_s, (
            f"the main thread looked {looked_at - returned_at[0]:+.3f} s from the call's return"
        )
