"""The ports the test and bench stacks give their services (``services.bench.cluster.
free_port``): outside the kernel's ephemeral range, so no outgoing connection opened
between the pick and the service's own bind can take one (a worker's metrics port was
taken so in a CI run, its Kafka client's connection sitting on it), and never the same
twice in a process."""

from __future__ import annotations

import socket

from services.bench.cluster import ephemeral_ports, free_port


def test_ports_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    low, high = ephemeral_ports()
    assert 1024 < low <= high
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < low for p in ports)


def test_a_port_in_use_is_not_handed_out() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert taken not in {free_port() for _ in range(300)}
