"""The network test bed itself (tests/netbed.py): a partition stops TCP between two nodes
and healing restores it; a one-way cut fails connections while the other direction's
frames still pass; a delay holds each frame at least that long; a loss drops about its
share of frames; nothing of a bed is left after it, nor of a killed run's."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import netbed
import pytest

from pybk.testing.waiting import wait_until

pytestmark = pytest.mark.skipif(netbed.skip_reason() is not None,
                                reason=str(netbed.skip_reason()))

PORT = 7000
#: A TCP echo server on ``argv[1]``:PORT, one thread per connection.
ECHO = f"""
import socket, sys, threading
server = socket.create_server((sys.argv[1], {PORT}))
def echo(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
#: Try to connect to ``argv[1]``:``argv[2]`` once within 2 s: exit status 0 if it worked.
CONNECT = """
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
"""


def connects(address: str, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection((address, PORT), timeout=timeout_s).close()
    except OSError:
        return False
    return True


@pytest.fixture
def bed():
    """Node ``a`` running an echo server, the test process as node ``test``."""
    with netbed.NetBed(["a"], host="test", seed=7) as made:
        made.popen("a", [sys.executable, "-c", ECHO, made.address("a")])
        wait_until(lambda: connects(made.address("a")), "the echo server serves")
        yield made


def test_a_partition_stops_tcp_and_heal_restores_it(bed):
    a = bed.address("a")
    with socket.create_connection((a, PORT), timeout=5) as conn:
        bed.nemesis.partition("a")
        conn.settimeout(1.0)
        conn.sendall(b"lost?")
        with pytest.raises(TimeoutError):
            conn.recv(10)
        assert not connects(a)
        bed.nemesis.heal()
        # TCP retransmits the bytes sent during the partition: they come back now.
        conn.settimeout(10.0)
        assert conn.recv(10) == b"lost?"
    assert connects(a)
    assert [what for _, what in bed.nemesis.history] == ["partition a from ['test']", "heal"]


def test_a_one_way_cut_fails_connections_while_the_other_way_passes(bed):
    a, test = bed.address("a"), bed.address("test")
    with socket.create_server((test, PORT + 1)) as listener:
        bed.nemesis.one_way("test", "a")
        from_a_before, _ = bed.frames("a", "test")
        _, to_a_dropped_before = bed.frames("test", "a")
        # From a: its SYNs pass, the answers do not.
        attempt = bed.popen("a", [sys.executable, "-c", CONNECT, test, str(PORT + 1)],
                            stderr=subprocess.DEVNULL)
        assert attempt.wait(30) != 0
        assert not connects(a)
        assert bed.frames("a", "test")[0] > from_a_before
        assert bed.frames("test", "a")[1] > to_a_dropped_before
        bed.nemesis.heal()
        attempt = bed.popen("a", [sys.executable, "-c", CONNECT, test, str(PORT + 1)])
        assert attempt.wait(30) == 0
        listener.accept()[0].close()
    assert connects(a, timeout_s=5)


def test_a_delay_holds_each_frame_at_least_that_long(bed):
    with socket.create_connection((bed.address("a"), PORT), timeout=10) as conn:
        bed.nemesis.delay(100, jitter_ms=20)
        started = time.monotonic()
        conn.sendall(b"ping")
        assert conn.recv(10) == b"ping"
        # A lower bound only: out (80 ms or more), back (80 ms or more).
        assert time.monotonic() - started >= 0.160


def test_a_loss_drops_about_its_share_of_frames(bed):
    assert connects(bed.address("a"))  # a's MAC address is known: no ARP to lose below
    bed.nemesis.loss(0.3, among=["test", "a"])
    passed_before, dropped_before = bed.frames("test", "a")

    def seen() -> int:
        return sum(bed.frames("test", "a")) - passed_before - dropped_before

    # In bursts the switch takes in before the next: a burst larger than the TAP device's
    # queue would lose frames in the kernel, where the switch cannot count them.
    bursts, burst = 20, 100
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for number in range(bursts):
            for _ in range(burst):
                udp.sendto(b"%d" % number, (bed.address("a"), PORT))
            wait_until(lambda n=number: seen() >= (n + 1) * burst, "the switch takes a burst")
    passed, dropped = bed.frames("test", "a")
    share = (dropped - dropped_before) / seen()
    assert 0.2 < share < 0.4, (passed, dropped)


def test_nothing_is_left_of_a_bed_nor_of_a_killed_run():
    with netbed.NetBed(["a", "b"], host="test") as bed:
        namespaces = [bed.namespace("a"), bed.namespace("b")]
        sleeper = bed.popen("a", ["sleep", "600"])
    assert sleeper.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not set(namespaces) & {line.split()[0] for line in listed.splitlines()}
    assert f"pbk{bed.pid}n" not in subprocess.run(["ip", "link"], capture_output=True,
                                                  text=True).stdout
    # A run killed before its teardown left a namespace (with a process in it) behind.
    gone = subprocess.Popen(["true"])
    gone.wait()
    leftover = f"pybkbed-{gone.pid}-0"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    orphan = subprocess.Popen(["ip", "netns", "exec", leftover, "sleep", "600"])
    try:
        # `ip netns exec` enters the namespace some time after Popen returns: a removal
        # before then would find nobody to kill.
        wait_until(lambda: str(orphan.pid) in subprocess.run(
            ["ip", "netns", "pids", leftover], capture_output=True, text=True).stdout.split(),
            "the orphan to be in its namespace")
        assert leftover in netbed.remove_leftovers()
        assert orphan.wait(60) == -9
    finally:
        orphan.kill()
        subprocess.run(["ip", "netns", "del", leftover], capture_output=True)


def test_the_nemesis_refuses_unknown_nodes_and_bad_values(bed):
    with pytest.raises(ValueError, match="no node"):
        bed.nemesis.partition("a", ["nowhere"])
    with pytest.raises(ValueError, match="probability"):
        bed.nemesis.loss(1.5)
    with pytest.raises(ValueError, match="0 ms or more"):
        bed.nemesis.delay(-1)
