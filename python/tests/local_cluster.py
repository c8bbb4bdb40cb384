"""Real rdkv clusters for tests and benchmarks: `rdkv-server` processes on
loopback, from release binaries, each node in a temporary directory.

The binaries come from ``$RDKV_BIN_DIR`` (default: ``target/release`` of
this repository); build them with ``cargo build --release -p rdkv-server``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import rdkv

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def server_binary() -> Path:
    """The rdkv-server binary to start; fails with what to do if absent."""
    bin_dir = Path(os.environ.get("RDKV_BIN_DIR", REPO / "target" / "release"))
    binary = bin_dir / "rdkv-server"
    if not binary.is_file():
        raise FileNotFoundError(
            f"{binary} not found: run `cargo build --release -p rdkv-server` "
            "or set RDKV_BIN_DIR to the directory holding rdkv-server"
        )
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    id: int
    client: str
    peer: str
    http: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen | None = None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=5) as reply:
            return reply.read().decode()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/health", timeout=1) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


# One sample of the Prometheus text format: name{labels} value.
_SAMPLE = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')


def request_count(metrics_text: str, ops: tuple[str, ...]) -> float:
    """Sum of rdkv_requests_total over every transport for the given ops."""
    total = 0.0
    for line in metrics_text.splitlines():
        sample = _SAMPLE.match(line)
        if not sample or sample["name"] != "rdkv_requests_total":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', sample["labels"]))
        if labels.get("op") in ops:
            total += float(sample["value"])
    return total


@dataclass
class LocalCluster:
    """``nodes`` rdkv-server processes forming one cluster on 127.0.0.1."""

    nodes: int = 3
    token: str | None = "py-test-token"
    region_mib: int = 512
    max_value_bytes: int = 4 * MIB
    extra_args: list[str] = field(default_factory=list)
    members: list[Node] = field(default_factory=list, init=False)
    _dir: Path | None = field(default=None, init=False)

    @property
    def endpoints(self) -> list[str]:
        return [node.client for node in self.members]

    def start(self, timeout: float = 30.0) -> "LocalCluster":
        binary = server_binary()
        self._dir = Path(tempfile.mkdtemp(prefix="rdkv-py-"))
        for id in range(1, self.nodes + 1):
            self.members.append(
                Node(
                    id=id,
                    client=f"127.0.0.1:{free_port()}",
                    peer=f"127.0.0.1:{free_port()}",
                    http=f"127.0.0.1:{free_port()}",
                    data_dir=self._dir / f"node-{id}",
                    log_path=self._dir / f"node-{id}.log",
                )
            )
        initial = ",".join(f"{n.id}={n.peer}" for n in self.members)
        for node in self.members:
            args = [
                str(binary),
                "--id", str(node.id),
                "--data-dir", str(node.data_dir),
                "--listen", node.client,
                "--peer-listen", node.peer,
                "--http-listen", node.http,
                "--resp-listen", "off",
                "--initial-cluster", initial,
                "--region-mib", str(self.region_mib),
                "--max-value-bytes", str(self.max_value_bytes),
                "--heartbeat-ms", "50",
                *self.extra_args,
            ]
            if self.token:
                args += ["--token", self.token]
            log = open(node.log_path, "wb")
            node.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        try:
            self._wait_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_serving(self, timeout: float) -> None:
        """Until every node is healthy and a write commits."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            if all(node.healthy() for node in self.members):
                try:
                    with self.client(timeout=2.0) as client:
                        client.put(b"__local_cluster_ready", b"1")
                        client.delete(b"__local_cluster_ready")
                    return
                except rdkv.Error as error:
                    last_error = error
            time.sleep(0.1)
        raise TimeoutError(f"cluster not serving after {timeout} s ({last_error}):\n{self.logs()}")

    def _check_alive(self) -> None:
        for node in self.members:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(
                    f"rdkv-server {node.id} exited ({node.process.returncode}):\n{self.logs()}"
                )

    def client(self, **options) -> rdkv.Client:
        options.setdefault("token", self.token)
        return rdkv.Client(self.endpoints, **options)

    def total_requests(self, *ops: str) -> float:
        """rdkv_requests_total of these ops, summed over every node."""
        return sum(request_count(node.metrics(), ops) for node in self.members)

    def logs(self) -> str:
        parts = []
        for node in self.members:
            try:
                text = node.log_path.read_text(errors="replace")
            except OSError:
                text = "(no log)"
            parts.append(f"--- node {node.id} ---\n{text[-4000:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """SIGKILL every node (a dead cluster), keeping the directory."""
        for node in self.members:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGKILL)
                node.process.wait()

    def stop(self) -> None:
        for node in self.members:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
        for node in self.members:
            if node.process is None:
                continue
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
