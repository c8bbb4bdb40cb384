"""Real rdkv clusters for tests and benchmarks: `rdkv-server` processes on
loopback, from release binaries, each node in a temporary directory.

The binaries come from ``$RDKV_BIN_DIR`` (default: ``target/release`` of
this repository); build them with ``cargo build --release -p rdkv-server``.

With ``tls=True`` every port of every node speaks TLS, peers use mutual
TLS and clients must show a certificate: a test CA is made with the
``openssl`` commands of docs/security.md (:func:`make_ca`, :func:`issue`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
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


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA (P-256) in directory: name.pem and name.key."""
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.pem"),
        "-days", "30", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    return directory / f"{name}.pem"


def issue(directory: Path, ca: str, name: str, alt_names: str) -> tuple[Path, Path]:
    """A certificate the CA `ca` signs for alt_names (e.g. "IP:127.0.0.1"),
    good for a server and a client: (cert, key)."""
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    extensions = directory / f"{name}.ext"
    extensions.write_text(
        f"subjectAltName={alt_names}\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=critical,digitalSignature\n"
        "authorityKeyIdentifier=keyid\n"
    )
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(directory / f"{ca}.pem"),
        "-CAkey", str(directory / f"{ca}.key"), "-CAcreateserial", "-out", str(cert),
        "-days", "30", "-extfile", str(extensions),
    )
    return cert, key


@dataclass
class Pki:
    """The cluster's CA, one certificate for every node (127.0.0.1) and one
    for clients."""

    ca: Path
    node_cert: Path
    node_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path) -> "Pki":
        ca = make_ca(directory, "ca")
        node_cert, node_key = issue(directory, "ca", "node", "IP:127.0.0.1,DNS:localhost")
        client_cert, client_key = issue(directory, "ca", "client", "DNS:client.test")
        return cls(ca, node_cert, node_key, client_cert, client_key)

    def server_args(self) -> list[str]:
        return [
            "--tls-cert", str(self.node_cert), "--tls-key", str(self.node_key),
            "--tls-ca", str(self.ca),
            "--peer-tls-cert", str(self.node_cert), "--peer-tls-key", str(self.node_key),
            "--peer-tls-ca", str(self.ca),
        ]

    def client_options(self) -> dict:
        return {
            "tls_ca": str(self.ca),
            "tls_cert": str(self.client_cert),
            "tls_key": str(self.client_key),
        }

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


# How many times `start` chooses ports before giving up on taken ones.
PORT_ATTEMPTS = 3
# What an rdkv-server that could not bind a listener says (io::Error's text).
ADDRESS_IN_USE = "Address already in use"


class NodeExited(RuntimeError):
    """A node's process ended while the cluster started or ran."""

    def __init__(self, message: str, port_taken: bool):
        super().__init__(message)
        self.port_taken = port_taken


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
    resp: str | None = None
    ssl_context: ssl.SSLContext | None = None

    def _get(self, path: str, timeout: float):
        scheme = "https" if self.ssl_context else "http"
        url = f"{scheme}://{self.http}{path}"
        return urllib.request.urlopen(url, timeout=timeout, context=self.ssl_context)

    def metrics(self) -> str:
        with self._get("/metrics", timeout=5) as reply:
            return reply.read().decode()

    def healthy(self) -> bool:
        try:
            with self._get("/health", timeout=1) as reply:
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
    tls: bool = False
    resp: bool = False
    pki: Pki | None = field(default=None, init=False)
    members: list[Node] = field(default_factory=list, init=False)
    _dir: Path | None = field(default=None, init=False)

    @property
    def endpoints(self) -> list[str]:
        return [node.client for node in self.members]

    def start(self, timeout: float = 30.0) -> "LocalCluster":
        """Starts the nodes; again on new ports (and a new directory) when a
        port chosen free was taken before a node bound it: `free_port`
        releases the port it found, and another process (an outgoing
        connection's ephemeral port, say) may take it first."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start_once(timeout)
            except NodeExited as exited:
                if attempt + 1 == PORT_ATTEMPTS or not exited.port_taken:
                    raise
                self.members = []
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "LocalCluster":
        binary = server_binary()
        self._dir = Path(tempfile.mkdtemp(prefix="rdkv-py-"))
        if self.tls:
            self.pki = Pki.make(self._dir)
        for id in range(1, self.nodes + 1):
            self.members.append(
                Node(
                    id=id,
                    client=f"127.0.0.1:{free_port()}",
                    peer=f"127.0.0.1:{free_port()}",
                    http=f"127.0.0.1:{free_port()}",
                    data_dir=self._dir / f"node-{id}",
                    log_path=self._dir / f"node-{id}.log",
                    resp=f"127.0.0.1:{free_port()}" if self.resp else None,
                    ssl_context=self.pki.ssl_context() if self.pki else None,
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
                "--resp-listen", node.resp or "off",
                "--initial-cluster", initial,
                "--region-mib", str(self.region_mib),
                "--max-value-bytes", str(self.max_value_bytes),
                "--heartbeat-ms", "50",
                *self.extra_args,
            ]
            if self.token:
                args += ["--token", self.token]
            if self.pki:
                args += self.pki.server_args()
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
                log = node.log_path.read_text(errors="replace")
                raise NodeExited(
                    f"rdkv-server {node.id} exited ({node.process.returncode}):\n{self.logs()}",
                    port_taken=ADDRESS_IN_USE in log,
                )

    def client(self, **options) -> rdkv.Client:
        options.setdefault("token", self.token)
        if self.pki:
            for name, value in self.pki.client_options().items():
                options.setdefault(name, value)
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
            # The error a node exited with comes before its backtrace, which
            # may be longer than the tail shown.
            found = re.search(r"(?m)^Error: ", text)
            error = f"{text[found.start():found.start() + 1500]}\n...\n" if found else ""
            parts.append(f"--- node {node.id} ---\n{error}{text[-4000:]}")
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
