"""rdkv from Python against redis-py, in one run on one machine.

Starts a 3-node rdkv cluster (release binaries, see tests/local_cluster.py)
and a redis-server (Debian's, from PATH or $REDIS_SERVER_BIN), loads the same
values into both, then measures, interleaving rdkv and Redis round by round:

- batch reads of 64 x 1 MiB and of 1,000 x 4 KiB: rdkv `batch_get_into`
  preallocated numpy arrays (one-sided over shared memory, and over TCP),
  against redis-py pipelined GETs (one pipeline per batch) — MB/s, median of
  the rounds, and the ratio to Redis;
- single-key GET latency of a 4 KiB value: rdkv `get` and `get_into`
  against redis-py `get` (p50/p99 in microseconds);
- the one copy into the caller's buffer: numpy copying the same bytes
  between two arrays, as a share of a `batch_get_into`.

    python python/bench/bench_vs_redis.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from local_cluster import MIB, LocalCluster, free_port  # noqa: E402


class LocalRedis:
    """A redis-server on 127.0.0.1 without persistence, removed on exit."""

    def __enter__(self) -> "LocalRedis":
        binary = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
        if not binary:
            raise SystemExit("redis-server not found: apt-get install redis-server")
        self.dir = tempfile.mkdtemp(prefix="rdkv-bench-redis-")
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--proto-max-bulk-len", "512mb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.version = self.client.info("server")["redis_version"]
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def batch_rows(rdkv_shm, rdkv_tcp, redis_client, count, size, rounds, iterations):
    """MB/s of each reader of `count` values of `size` bytes, median of rounds."""
    rng = np.random.default_rng(size)
    keys = [f"bench-{size}-{i:05}".encode() for i in range(count)]
    values = [rng.integers(0, 256, size=size, dtype=np.uint8) for _ in range(count)]
    rdkv_shm.batch_put_from(keys, values)
    pipe = redis_client.pipeline(transaction=False)
    for key, value in zip(keys, values):
        pipe.set(key, value.tobytes())
    pipe.execute()

    targets = [np.empty(size, dtype=np.uint8) for _ in range(count)]

    def rdkv_read(client):
        def run():
            for _ in range(iterations):
                client.batch_get_into(keys, targets)
        return run

    def redis_read():
        for _ in range(iterations):
            pipe = redis_client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            got = pipe.execute()
        assert got[0] == values[0].tobytes()

    sources = [np.empty(size, dtype=np.uint8) for _ in range(count)]

    def copy_only():
        for _ in range(iterations):
            for source, target in zip(sources, targets):
                np.copyto(target, source)

    readers = {
        "rdkv batch_get_into (shm, one-sided)": rdkv_read(rdkv_shm),
        "rdkv batch_get_into (tcp)": rdkv_read(rdkv_tcp),
        "redis-py pipelined GET": redis_read,
        "copy into the buffers alone (numpy)": copy_only,
    }
    for run in readers.values():  # warm-up: maps, connections, caches
        run()
    samples = {name: [] for name in readers}
    for _ in range(rounds):
        for name, run in readers.items():
            samples[name].append(timed(run))
    # What the readers got is what was written (the copy-only row wrote the
    # buffers last, so read once more).
    for client in (rdkv_shm, rdkv_tcp):
        assert client.batch_get_into(keys, targets) == [size] * count
        assert all(np.array_equal(v, t) for v, t in zip(values, targets))
    total_mb = count * size * iterations / 1e6
    return {name: total_mb / statistics.median(s) for name, s in samples.items()}


def latency_us(fn, n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def latency_rows(rdkv_shm, rdkv_tcp, redis_client, n: int):
    key, value = b"bench-latency", bytes(range(256)) * 16
    rdkv_shm.put(key, value)
    redis_client.set(key, value)
    buffer = bytearray(len(value))
    readers = {
        "rdkv get (shm, one-sided)": lambda: rdkv_shm.get(key),
        "rdkv get_into (shm, one-sided)": lambda: rdkv_shm.get_into(key, buffer),
        "rdkv get (tcp)": lambda: rdkv_tcp.get(key),
        "redis-py get": lambda: redis_client.get(key),
    }
    for run in readers.values():
        for _ in range(200):
            run()
    return {name: latency_us(run, n) for name, run in readers.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--latency-samples", type=int, default=20000)
    args = parser.parse_args()

    with LocalCluster(nodes=3, token=None) as cluster, LocalRedis() as local_redis:
        shm = cluster.client(transport="shm")
        tcp = cluster.client(transport="tcp")
        print(f"rdkv: 3 nodes (release), redis-server {local_redis.version}, "
              f"redis-py {redis.__version__}, numpy {np.__version__}, "
              f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        for count, size, iterations in [(64, MIB, 2), (1000, 4096, 4)]:
            rows = batch_rows(shm, tcp, local_redis.client, count, size, args.rounds, iterations)
            base = rows["redis-py pipelined GET"]
            label = f"{count} x {size // 1024} KiB" if size < MIB else f"{count} x {size // MIB} MiB"
            print(f"\nbatch read of {label} (median of {args.rounds} rounds of {iterations} batches)")
            print(f"  {'reader':<40} {'MB/s':>9} {'vs redis-py':>12}")
            for name, mbps in rows.items():
                print(f"  {name:<40} {mbps:>9.0f} {mbps / base:>11.2f}x")
        rows = latency_rows(shm, tcp, local_redis.client, args.latency_samples)
        base = rows["redis-py get"][0]
        print(f"\nsingle-key GET of a 4 KiB value ({args.latency_samples} sequential calls)")
        print(f"  {'reader':<40} {'p50 us':>9} {'p99 us':>9} {'p50 vs redis-py':>16}")
        for name, (p50, p99) in rows.items():
            print(f"  {name:<40} {p50:>9.1f} {p99:>9.1f} {p50 / base:>15.2f}x")
        stats = shm.one_sided_stats()
        print(f"\nrdkv shm client: {stats['served']} reads served one-sided, "
              f"{stats['fallbacks']} fallbacks to RPC")


if __name__ == "__main__":
    main()
