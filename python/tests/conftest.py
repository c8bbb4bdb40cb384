"""Fixtures: one 3-node cluster shared by the module's tests (each test uses
its own keys), and clients of it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from local_cluster import LocalCluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    with LocalCluster(nodes=3) as running:
        yield running


@pytest.fixture
def client(cluster):
    with cluster.client() as c:
        yield c
