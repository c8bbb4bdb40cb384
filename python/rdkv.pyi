"""rdkv: a replicated key-value store whose GETs read the servers' memory
directly (shared memory on the same host, RDMA where built).

Every call of :class:`Client` releases the GIL while it waits, so threads
scale; errors are :class:`Error` subclasses carrying ``code`` and
``retryable``.
"""

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, final

from typing_extensions import Buffer

__all__ = [
    "BufferTooSmall",
    "CasResult",
    "Client",
    "Error",
    "InvalidRequest",
    "NoSpace",
    "OutcomeUnknown",
    "ProtocolError",
    "Timeout",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "__version__",
]

__version__: str

_Key = bytes | str
"""A key: bytes, or str (encoded as UTF-8)."""
_Value = Buffer | str
"""A value to write: any buffer (bytes, bytearray, memoryview, numpy array) or str."""

class Error(Exception):
    """Base class of every rdkv error."""

    code: str
    """The cause: a server error code ('no_space', 'unauthenticated',
    'value_too_large', ...) or a client one ('connect_failed', 'timeout',
    'no_leader', 'outcome_unknown', 'buffer_too_small', ...)."""
    retryable: bool
    """Whether repeating the same call later may succeed."""
    written: int
    """Set by batch_put_from only: how many leading pairs were written."""

class NoSpace(Error):
    """The write would take the cluster past its quota. Deletes make room."""

class Unavailable(Error):
    """No server could serve the call (unreachable, no leader, connection lost)."""

class Timeout(Error):
    """The call ran out of time and changed nothing."""

class OutcomeUnknown(Error):
    """A write was sent but its reply never came: it may have been applied."""

class Unauthenticated(Error):
    """The cluster refused the token, or TLS failed (code 'tls_refused':
    certificates; 'tls_required': the server speaks TLS, pass tls_ca)."""

class TooLarge(Error):
    """A key, value, batch or frame exceeds the server's limits."""

class InvalidRequest(Error):
    """The request is malformed or impossible in the cluster's state."""

class BufferTooSmall(Error):
    """A value is longer than the buffer given for it."""

    index: int
    """Position of the key in the batch (0 for get_into)."""
    needed: int
    """The value's length in bytes."""

class ProtocolError(Error):
    """A frame could not be decoded, or the answer was of the wrong kind."""

@final
class CasResult:
    """What :meth:`Client.cas` did; true when it succeeded."""

    succeeded: bool
    version: int
    """On success the write's version; on failure the applied index compared at."""
    current_value: bytes | None
    """On failure, the key's value then (None: absent)."""
    current_version: int | None
    """On failure, the key's version then (None: absent)."""
    def __bool__(self) -> bool: ...

@final
class Client:
    """A connection to an rdkv cluster, safe to share between threads."""

    def __new__(
        cls,
        endpoints: str | Sequence[str],
        token: str | None = None,
        transport: Literal["auto", "tcp", "shm", "rdma"] = "auto",
        consistency: Literal["lease", "linearizable", "follower"] = "lease",
        timeout: float = 5.0,
        connect_timeout: float = 2.0,
        max_lag: int = 1000,
        max_attempts: int = 16,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
    ) -> Client:
        """Connects to the first endpoint that answers ("host:port", a
        comma-separated string of them, or a list). Raises Unauthenticated
        for a wrong token or a TLS refusal, Unavailable when no endpoint
        answers. tls_ca (a PEM CA file) turns TLS on; tls_cert and tls_key
        are this client's certificate for servers that verify clients."""

    def get(self, key: _Key) -> bytes | None:
        """The value of key, or None when it is absent."""

    def get_with_version(self, key: _Key) -> tuple[bytes, int] | None:
        """(value, version) of key, or None; the version is what cas compares."""

    def get_into(self, key: _Key, buffer: Buffer) -> int | None:
        """Reads key's value into the start of a writable, C-contiguous
        buffer; returns its length, or None when the key is absent.
        Raises BufferTooSmall when it does not fit."""

    def put(self, key: _Key, value: _Value, ttl: float | None = None) -> int:
        """Writes value under key (expiring ttl seconds after the leader
        takes it, if given); returns the write's version."""

    def delete(self, key: _Key) -> bool:
        """Deletes key; returns whether it existed."""

    def cas(self, key: _Key, expected_version: int | None, new_value: _Value | None) -> CasResult:
        """Writes new_value (None: deletes) only if key's version is
        expected_version (None: only if key is absent)."""

    def mget(self, keys: Iterable[_Key]) -> list[bytes | None]:
        """The values of keys, None for each absent one, in order."""

    def mput(self, pairs: Mapping[_Key, _Value] | Iterable[tuple[_Key, _Value]]) -> int:
        """Writes every pair atomically (one log entry); returns its version."""

    def scan(
        self, start: _Key | None = None, end: _Key | None = None, limit: int = 1000
    ) -> list[tuple[bytes, bytes]]:
        """Up to limit pairs in key order from start (inclusive) to end (exclusive)."""

    def batch_get_into(self, keys: Sequence[_Key], buffers: Sequence[Buffer]) -> list[int | None]:
        """Reads each key into its buffer; per key the bytes written, or
        None when absent. BufferTooSmall (with index) after filling the
        others if a value does not fit."""

    def batch_put_from(self, keys: Sequence[_Key], buffers: Sequence[_Value]) -> list[int]:
        """Writes each buffer under its key in requests of at most one frame
        (each atomic); returns each key's write version. On failure the
        exception's written says how many leading pairs were written."""

    def expire(self, key: _Key, ttl: float) -> bool:
        """Gives key a deadline ttl seconds from now; False when absent."""

    def persist(self, key: _Key) -> bool:
        """Removes key's deadline; False when absent or it had none."""

    def ttl(self, key: _Key) -> float | None:
        """Seconds left before key expires; math.inf if never; None if absent."""

    def ping(self) -> None:
        """A round trip to the current node."""

    def one_sided_stats(self) -> dict[str, int]:
        """Counters of the one-sided read path: served, fallbacks,
        lease_refusals, lag_refusals."""

    @property
    def endpoints(self) -> list[str]: ...
    @property
    def leader(self) -> str | None: ...
    def close(self) -> None:
        """Closes the connections; later calls raise RuntimeError."""

    def __enter__(self) -> Client: ...
    def __exit__(self, *args: object) -> bool: ...
