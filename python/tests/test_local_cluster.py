"""The test harness itself: LocalCluster starts even when a port it chose
free is taken before the node binds it (the race `free_port` leaves open)."""

import socket

import local_cluster
from local_cluster import LocalCluster


def test_a_port_taken_before_the_node_binds_it_is_chosen_again(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        real = local_cluster.free_port
        handed = []

        def first_one_taken() -> int:
            # Node 1's client port on the first attempt is the held one.
            port = taken if not handed else real()
            handed.append(port)
            return port

        monkeypatch.setattr(local_cluster, "free_port", first_one_taken)
        with LocalCluster(nodes=1) as cluster:
            assert taken not in [int(n.client.rsplit(":", 1)[1]) for n in cluster.members]
            with cluster.client() as client:
                client.put(b"harness", b"ok")
                assert client.get(b"harness") == b"ok"
        assert handed.count(taken) == 1, "the taken port was not the first one handed out"
