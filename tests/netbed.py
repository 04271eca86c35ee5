"""A network test bed: nodes in network namespaces of their own, joined by a switch in
the test process that a nemesis controls (partitions, one-way cuts, delay, loss).

Why a switch in user space
    The machines that run the suite have network namespaces, veth pairs and TAP devices,
    but neither ``tc netem`` nor ``nft``.  So each node gets a TAP device (opened here,
    then moved into the node's namespace: the file descriptor stays valid), and the test
    process forwards the Ethernet frames between the devices itself.  Every frame between
    two nodes crosses that switch, so a network fault is nothing but a rule of the switch.

Topology
    Node ``name`` lives in namespace ``pybkbed-<pid>-<index>`` with address
    ``10.77.<subnet>.<index + 1>/24`` on its TAP device ``pbk<pid>n<index>``; ``<pid>``
    is the test run's.  The *host* node (``host=``) is the test process itself: its TAP
    stays in the root namespace with an address of the subnet, so the test's own clients
    (a ``pybk.connect`` in the test) reach the other nodes through the switch too.  The
    subnet is one no device of the root namespace uses.  :meth:`NetBed.popen` starts a
    process inside a node's namespace (``ip netns exec``); it binds to the node's address
    (:meth:`NetBed.address`).

The switch (one thread, :class:`_Switch`)
    Learns each node's MAC address from the source of its frames and forwards by
    destination; broadcasts (ARP) and frames to unknown addresses go to every other port.
    A frame from node ``a`` to node ``b`` obeys the rule of the ordered pair ``(a, b)``
    (:class:`Link`): dropped (cut), dropped with probability ``loss``, or held for
    ``delay_ms`` plus a uniform jitter within ``± jitter_ms`` (a heap of timers).  Frames
    of one link stay in order, delayed or not (a frame never overtakes an earlier one of
    its link, so jitter delays the frames behind a late one too).  Loss and jitter draw
    from one ``random.Random(seed)``: a run's draws repeat for the same frames.  Each
    ordered pair's frames passed and dropped are counted (:meth:`NetBed.frames`).
    A thread is enough: one TCP stream crosses it at about 30 MB/s (25,000-35,000 frames
    a second) for about 8 µs of the test process's CPU per frame, sender's included
    (measured on the project's 2-core machines), far above what the tests send.

The nemesis (:class:`Nemesis`)
    Changes the rules while processes run; each change is logged with its wall-clock
    time (``Nemesis.history`` and the ``netbed`` logger).

Teardown, leftovers, skips
    Leaving the context (also on an error) kills every process started in the bed (its
    process group, then whatever is left in the namespace), stops the switch, closes the
    TAP devices (the kernel removes them) and deletes the namespaces.  A run killed
    before that leaves namespaces named after its pid: the next bed deletes those of pids
    no longer alive, with their processes.  :func:`skip_reason` says why a machine cannot
    make a bed (not root, no ``ip``, no ``/dev/net/tun``); tests skip with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import heapq
import logging
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from pybk.cluster.lifeline import death_signal_preexec

log = logging.getLogger("netbed")

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_NAMESPACE = re.compile(r"^pybkbed-(\d+)-(\d+)\b")
#: The bed's subnets are 10.77.<n>.0/24; the third byte starts from the pid's.
_PREFIX = "10.77"
#: How long a process of the bed has to exit once killed before it is given up on.
_REAP_TIMEOUT_S = 10.0


def skip_reason() -> str | None:
    """Why this machine cannot make a bed, or None if it can."""
    if os.geteuid() != 0:
        return "the network test bed needs root (network namespaces, TAP devices)"
    if shutil.which("ip") is None:
        return "the network test bed needs the ip command (iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "the network test bed needs /dev/net/tun (TAP devices)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30, stdin=subprocess.DEVNULL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL every process still in ``namespace`` (``ip netns pids``)."""
    found = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in found:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_leftovers() -> list[str]:
    """Delete the namespaces (and kill their processes) of beds whose run is gone; the
    names deleted."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        found = _NAMESPACE.match(line)
        if found and not _alive(int(found.group(1))):
            namespace = line.split()[0]
            _kill_namespace_processes(namespace)
            _ip("netns", "del", namespace, check=False)
            removed.append(namespace)
    if removed:
        log.warning("removed the network namespaces of dead test runs: %s", removed)
    return removed


def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def _free_subnet() -> int:
    """A third byte ``n`` such that no root-namespace address is in 10.77.<n>.0/24."""
    used = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    start = os.getpid() % 250
    for step in range(250):
        n = (start + step) % 250 + 1
        if f"{_PREFIX}.{n}." not in used:
            return n
    raise RuntimeError(f"every subnet {_PREFIX}.*.0/24 is in use")


# -- the switch's rules -------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """The rule of one ordered pair of nodes: what happens to a frame from one to the
    other.  ``loss`` is a probability (0 to 1); delays are in milliseconds."""

    cut: bool = False
    loss: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0


PASS = Link()


@dataclass
class _Port:
    node: str
    fd: int


class _Switch:
    """The forwarding thread; see the module docstring."""

    def __init__(self, ports: list[_Port], seed: int) -> None:
        self.ports = ports
        self.rules: dict[tuple[str, str], Link] = {}  # replaced whole, never mutated
        self.passed: dict[tuple[str, str], int] = {}
        self.dropped: dict[tuple[str, str], int] = {}
        self._by_fd = {port.fd: port for port in ports}
        self._macs: dict[bytes, _Port] = {}
        self._rng = random.Random(seed)
        self._held: list[tuple[float, int, int, bytes, tuple[str, str]]] = []
        self._last_due: dict[tuple[str, str], float] = {}
        self._sequence = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="netbed-switch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")
        self._thread.join(10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        poller = select.poll()
        for port in self.ports:
            poller.register(port.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop:
            timeout_ms = None
            if self._held:
                timeout_ms = max(0.0, (self._held[0][0] - time.monotonic()) * 1000)
            for fd, _ in poller.poll(timeout_ms):
                if fd == self._wake_r:
                    continue
                self._receive(self._by_fd[fd])
            now = time.monotonic()
            while self._held and self._held[0][0] <= now:
                _, _, fd, frame, pair = heapq.heappop(self._held)
                self._send(fd, frame, pair)

    def _receive(self, port: _Port) -> None:
        while True:
            try:
                frame = os.read(port.fd, 65536)
            except BlockingIOError:
                return
            except OSError as e:  # the device went away (teardown)
                if e.errno in (errno.EBADFD, errno.EBADF, errno.EIO):
                    return
                raise
            if len(frame) < 14:
                continue
            destination, source = frame[:6], frame[6:12]
            if not source[0] & 1:
                self._macs[source] = port
            target = None if destination[0] & 1 else self._macs.get(destination)
            outs = [target] if target is not None else \
                [p for p in self.ports if p is not port]
            for out in outs:
                if out is not port:
                    self._forward(port.node, out, frame)

    def _forward(self, source: str, out: _Port, frame: bytes) -> None:
        pair = (source, out.node)
        rule = self.rules.get(pair, PASS)
        if rule.cut or (rule.loss and self._rng.random() < rule.loss):
            self.dropped[pair] = self.dropped.get(pair, 0) + 1
            return
        now = time.monotonic()
        due = now
        if rule.delay_ms or rule.jitter_ms:
            due += max(0.0, rule.delay_ms + self._rng.uniform(-rule.jitter_ms,
                                                              rule.jitter_ms)) / 1000
        due = max(due, self._last_due.get(pair, 0.0))  # never overtake the link's earlier
        if due <= now:
            self._send(out.fd, frame, pair)
            return
        self._last_due[pair] = due
        self._sequence += 1
        heapq.heappush(self._held, (due, self._sequence, out.fd, frame, pair))

    def _send(self, fd: int, frame: bytes, pair: tuple[str, str]) -> None:
        try:
            os.write(fd, frame)
        except (BlockingIOError, OSError):  # a full queue drops, as a real switch does
            self.dropped[pair] = self.dropped.get(pair, 0) + 1
            return
        self.passed[pair] = self.passed.get(pair, 0) + 1


# -- the nemesis --------------------------------------------------------------------------

class Nemesis:
    """Changes the switch's rules; every change is logged (``history``: wall-clock time
    and what changed).  Rules add up (a delay stays while a partition comes and goes)
    until :meth:`heal` passes everything again."""

    def __init__(self, switch: _Switch, nodes: Sequence[str]) -> None:
        self._switch = switch
        self.nodes = tuple(nodes)
        self.history: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def _change(self, what: str, pairs: Iterable[tuple[str, str]], **fields: object) -> None:
        with self._lock:
            rules = dict(self._switch.rules)
            for pair in pairs:
                unknown = set(pair) - set(self.nodes)
                if unknown:
                    raise ValueError(f"no node {sorted(unknown)} in the bed; its nodes are "
                                     f"{list(self.nodes)}")
                rules[pair] = dataclasses.replace(rules.get(pair, PASS), **fields)
            self._switch.rules = rules  # one assignment: the switch sees all or nothing
            self.history.append((time.time(), what))
        log.info("nemesis: %s", what)

    def _others(self, node: str, others: Iterable[str] | None) -> list[str]:
        return [n for n in (self.nodes if others is None else others) if n != node]

    def partition(self, node: str, others: Iterable[str] | None = None) -> None:
        """Cut ``node`` from ``others`` (default: every other node), both ways."""
        cut = self._others(node, others)
        self._change(f"partition {node} from {cut}",
                     [(node, o) for o in cut] + [(o, node) for o in cut], cut=True)

    def one_way(self, source: str, destination: str) -> None:
        """Drop the frames from ``source`` to ``destination`` only."""
        self._change(f"cut {source} -> {destination}", [(source, destination)], cut=True)

    def halves(self, one: Iterable[str], other: Iterable[str]) -> None:
        """Cut every link between the two groups, both ways."""
        one, other = list(one), list(other)
        self._change(f"halves {one} | {other}",
                     [(a, b) for a in one for b in other] + [(b, a) for a in one for b in other],
                     cut=True)

    def _pairs(self, among: Iterable[str] | None) -> list[tuple[str, str]]:
        nodes = list(self.nodes if among is None else among)
        return [(a, b) for a in nodes for b in nodes if a != b]

    def delay(self, ms: float, jitter_ms: float = 0.0,
              among: Iterable[str] | None = None) -> None:
        """Hold every frame between ``among`` (default: all nodes) ``ms`` ± ``jitter_ms``."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay and jitter are 0 ms or more, not {ms} and {jitter_ms}")
        self._change(f"delay {ms} ms ± {jitter_ms} ms among {among or 'all'}",
                     self._pairs(among), delay_ms=ms, jitter_ms=jitter_ms)

    def loss(self, p: float, among: Iterable[str] | None = None) -> None:
        """Drop each frame between ``among`` (default: all nodes) with probability ``p``."""
        if not 0 <= p <= 1:
            raise ValueError(f"a loss is a probability from 0 to 1, not {p}")
        self._change(f"loss {p} among {among or 'all'}", self._pairs(among), loss=p)

    def heal(self) -> None:
        """Pass every frame again, at once."""
        with self._lock:
            self._switch.rules = {}
            self.history.append((time.time(), "heal"))
        log.info("nemesis: heal")


# -- the bed ------------------------------------------------------------------------------

class NetBed:
    """Nodes named ``nodes`` in namespaces of their own, plus the test process as node
    ``host`` (if given), joined by the switch; a context manager (see the module
    docstring).  ``seed`` seeds the switch's loss and jitter."""

    def __init__(self, nodes: Sequence[str], host: str | None = None, seed: int = 0) -> None:
        names = [*nodes, *([host] if host else [])]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"a bed needs distinct node names, not {names}")
        if len(names) > 200:
            raise ValueError(f"a bed has at most 200 nodes, not {len(names)}")
        self.nodes = tuple(names)
        self.host = host
        self.seed = seed
        self.pid = os.getpid()
        self._addresses: dict[str, str] = {}
        self._namespaces: dict[str, str] = {}
        self._ports: list[_Port] = []
        self._processes: list[subprocess.Popen] = []
        self._switch: _Switch | None = None
        self.nemesis: Nemesis

    def address(self, node: str) -> str:
        """The node's IPv4 address."""
        return self._addresses[node]

    def namespace(self, node: str) -> str:
        return self._namespaces[node]

    def exec_prefix(self, node: str) -> list[str]:
        """The command prefix that runs a command in the node's namespace."""
        if node == self.host:
            return []
        return ["ip", "netns", "exec", self._namespaces[node]]

    def popen(self, node: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in the node's namespace, in a process group of its own that dies
        with the test process (SIGKILL) and is killed when the bed closes."""
        process = subprocess.Popen([*self.exec_prefix(node), *argv], start_new_session=True,
                                   preexec_fn=death_signal_preexec(signal.SIGKILL), **kwargs)
        self._processes.append(process)
        return process

    def frames(self, source: str, destination: str) -> tuple[int, int]:
        """Frames from ``source`` to ``destination`` so far: (passed, dropped)."""
        switch = self._switch
        assert switch is not None, "the bed is not open"
        pair = (source, destination)
        return switch.passed.get(pair, 0), switch.dropped.get(pair, 0)

    def __enter__(self) -> "NetBed":
        remove_leftovers()
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _open(self) -> None:
        subnet = _free_subnet()
        for index, node in enumerate(self.nodes):
            device = f"pbk{self.pid}n{index}"
            address = f"{_PREFIX}.{subnet}.{index + 1}"
            self._addresses[node] = address
            self._ports.append(_Port(node, _open_tap(device)))
            if node == self.host:
                run = ["ip"]
            else:
                namespace = f"pybkbed-{self.pid}-{index}"
                _ip("netns", "add", namespace)
                self._namespaces[node] = namespace
                _ip("link", "set", device, "netns", namespace)
                _ip("-n", namespace, "link", "set", "lo", "up")
                run = ["ip", "-n", namespace]
            # No IPv6 link-local address: no router solicitations or MLD reports, so the
            # switch counts the nodes' own traffic only (and ARP).
            subprocess.run([*run, "link", "set", device, "addrgenmode", "none"], check=True,
                           capture_output=True, timeout=30)
            subprocess.run([*run, "addr", "add", f"{address}/24", "dev", device], check=True,
                           capture_output=True, timeout=30)
            subprocess.run([*run, "link", "set", device, "up"], check=True,
                           capture_output=True, timeout=30)
        self._switch = _Switch(self._ports, self.seed)
        self.nemesis = Nemesis(self._switch, self.nodes)
        self._switch.start()
        log.info("net bed of %s on %s.%d.0/24 (seed %d)", list(self.nodes), _PREFIX, subnet,
                 self.seed)

    def close(self) -> None:
        for process in self._processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(_REAP_TIMEOUT_S)
        for namespace in self._namespaces.values():
            _kill_namespace_processes(namespace)
        if self._switch is not None:
            self._switch.stop()
        for port in self._ports:
            os.close(port.fd)  # the kernel removes a TAP device with its last descriptor
        for namespace in self._namespaces.values():
            _ip("netns", "del", namespace, check=False)
        self._ports.clear()
        self._namespaces.clear()
