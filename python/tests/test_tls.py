"""TLS (issue 21): a 3-node cluster with TLS on every port and mutual TLS
between peers. The rdkv client with the CA and a client certificate works;
without the CA, or trusting another CA, it is refused with a TLS error;
redis-py with ssl=True works against every node's RESP port (a follower
forwards the write to the leader over TLS)."""

import tempfile
from pathlib import Path

import pytest
import redis

import rdkv
from local_cluster import LocalCluster, make_ca


@pytest.fixture(scope="module")
def tls_cluster():
    with LocalCluster(nodes=3, tls=True, resp=True) as running:
        yield running


def test_a_client_with_the_ca_and_a_certificate_reads_and_writes(tls_cluster):
    with tls_cluster.client(transport="tcp") as client:
        client.put(b"tls-py", b"over tls")
        assert client.get(b"tls-py") == b"over tls"


def test_a_client_without_the_ca_is_told_the_server_wants_tls(tls_cluster):
    with pytest.raises(rdkv.Unauthenticated) as refused:
        rdkv.Client(tls_cluster.endpoints, token=tls_cluster.token, transport="tcp")
    assert refused.value.code == "tls_required"
    assert not refused.value.retryable
    assert "speaks TLS" in str(refused.value)


def test_a_client_trusting_another_ca_is_refused(tls_cluster):
    with tempfile.TemporaryDirectory() as directory:
        other = make_ca(Path(directory), "other")
        options = tls_cluster.pki.client_options() | {"tls_ca": str(other)}
        with pytest.raises(rdkv.Unauthenticated) as refused:
            rdkv.Client(tls_cluster.endpoints, token=tls_cluster.token, transport="tcp", **options)
    assert refused.value.code == "tls_refused"
    assert "UnknownIssuer" in str(refused.value)


def test_a_certificate_without_its_key_is_a_value_error(tls_cluster):
    with pytest.raises(ValueError):
        rdkv.Client(tls_cluster.endpoints, tls_ca=str(tls_cluster.pki.ca),
                    tls_cert=str(tls_cluster.pki.client_cert))


def test_redis_py_with_ssl_works_through_every_node(tls_cluster):
    pki = tls_cluster.pki
    for node in tls_cluster.members:
        host, port = node.resp.rsplit(":", 1)
        connection = redis.Redis(
            host=host, port=int(port), password=tls_cluster.token, ssl=True,
            ssl_ca_certs=str(pki.ca), ssl_certfile=str(pki.client_cert),
            ssl_keyfile=str(pki.client_key),
        )
        key = f"redis-py-tls-{node.id}"
        assert connection.set(key, b"v")
        assert connection.get(key) == b"v"
        connection.close()
