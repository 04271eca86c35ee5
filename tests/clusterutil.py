"""Bookie processes for cluster tests: ``python -m pybk bookie`` children on loopback.

Each bookie gets directories of its own under the test's work directory, a free port
and test settings (a short ZooKeeper session, small journal preallocation).  Its output
(stdout and stderr) goes to ``<name>.log``; the ``pybk bookie: <id> serving at
<endpoint>`` line there says it is registered.  :meth:`BookieProcesses.close` SIGKILLs and
reaps every child still running, so a failing test leaves none behind.

Also the admin shell's commands run as an operator runs them (:func:`pybk`, :func:`ok`,
:func:`failed`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest
import zkutil

from pybk.cluster.node import BookieNode
from pybk.settings import ServerSettings
from pybk.storage import format_bookie

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
START_TIMEOUT_S = 60.0
_SERVING = re.compile(r"pybk bookie: (\S+) serving at (\S+),")


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """The (IPv4 address, port) pairs process ``pid`` listens on over TCP (its sockets,
    matched by inode against the kernel's table of listening sockets); an IPv6 socket's
    address is given as ``"::"`` or ``"::1"`` only when all-zero or loopback."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    hex_host, _, hex_port = fields[1].partition(":")
                    found.add((_kernel_address(hex_host), int(hex_port, 16)))
    return found


def _kernel_address(hex_host: str) -> str:
    """An address of /proc/net/tcp{,6}: IPv4 in host byte order (little-endian here)."""
    if len(hex_host) == 8:
        return socket.inet_ntoa(bytes.fromhex(hex_host)[::-1])
    return {"0" * 32: "::", "0" * 24 + "01000000": "::1"}.get(hex_host, hex_host)


def pybk_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pybk", "--log-level", "INFO", *args]


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT)


# -- pybk commands run as an operator runs them --------------------------------------------

def pybk(*args: str) -> subprocess.CompletedProcess:
    """``pybk ARGS`` run to its end (at most 60 s), its output captured; it never
    prints a traceback."""
    result = subprocess.run([sys.executable, "-m", "pybk", *args], env=child_env(),
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(*args: str) -> str:
    """What a command that succeeds prints on standard output."""
    result = pybk(*args)
    assert result.returncode == 0, result
    return result.stdout


def failed(*args: str) -> str:
    """The one line a failed command says on standard error (exit status 1)."""
    result = pybk(*args)
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and not result.stdout, result
    return result.stderr


def unused_port() -> int:
    """A loopback port with nothing listening on it (a ZooKeeper that is not there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class BookieProcess:
    """One ``pybk bookie`` child; :attr:`bookie_id` and :attr:`endpoint` once serving."""

    def __init__(self, name: str, process: subprocess.Popen, log_path: Path,
                 log_start: int) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        self._log_start = log_start  # a restarted bookie appends to its predecessor's log
        self.bookie_id = ""
        self.endpoint = ""

    @property
    def output(self) -> str:
        """What this process wrote (its last 6,000 characters)."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")[-6000:]

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> "BookieProcess":
        """Wait until it is registered and serving (its output says so)."""
        deadline = time.monotonic() + timeout_s
        while not (found := _SERVING.search(self.output)):
            assert self.process.poll() is None, \
                f"bookie {self.name} exited with {self.process.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, \
                f"bookie {self.name} was not serving within {timeout_s} s:\n{self.output}"
            time.sleep(0.02)
        self.bookie_id, self.endpoint = found.group(1), found.group(2)
        return self

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM it and return its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        assert self.process.returncode == -signal.SIGKILL, self.output


class BookieProcesses:
    """``pybk bookie`` children of one test (or module), on the cluster at ``address``."""

    def __init__(self, workdir: Path, address: str) -> None:
        self.workdir = Path(workdir)
        self.address = address
        self.started: list[BookieProcess] = []

    def start(self, name: str, *options: str,
              zk_timeout_ms: int = zkutil.SESSION_TIMEOUT_MS, host: str = "127.0.0.1",
              prefix: Sequence[str] = ()) -> BookieProcess:
        """A bookie named ``name`` (its directories' name; the id is ``host:port`` unless
        ``--bookie-id`` is among ``options``), serving at ``host`` on a free port.  A
        killed bookie's session ends after ``zk_timeout_ms``.  ``prefix`` goes before the
        command and must exec it in the same process (``ip netns exec NAME``: a bookie
        in a network namespace, tests/netbed.py)."""
        base = self.workdir / name
        log_path = self.workdir / f"{name}.log"
        command = [*prefix, *pybk_command(
            "bookie", "--zk", self.address, "--listen", f"{host}:0", "--format",
            "--journal-dir", str(base / "journal"), "--ledger-dir", str(base / "ledgers"),
            "--set", f"zkTimeout={zk_timeout_ms}", "--set", "journalPreAllocSizeMB=1",
            *options)]
        with open(log_path, "ab") as out:
            log_start = out.tell()
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=child_env())
        bookie = BookieProcess(name, process, log_path, log_start)
        self.started.append(bookie)
        return bookie

    def start_serving(self, count: int, prefix: str = "bookie",
                      zk_timeout_ms: int = zkutil.SESSION_TIMEOUT_MS,
                      options: tuple[str, ...] = ()) -> list[BookieProcess]:
        """``count`` bookies started together (``<prefix>1``...), each given ``options``;
        returns once every one serves."""
        bookies = [self.start(f"{prefix}{i}", *options, zk_timeout_ms=zk_timeout_ms)
                   for i in range(1, count + 1)]
        return [bookie.wait_serving() for bookie in bookies]

    def close(self) -> None:
        for bookie in self.started:
            if bookie.process.poll() is None:
                bookie.process.kill()
            try:
                bookie.process.wait(30)
            except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
                pass


@pytest.fixture
def address(zookeeper) -> str:
    """A freshly formatted cluster of the test's own on the session's ZooKeeper."""
    return zkutil.formatted_cluster(zookeeper)


@pytest.fixture
def bookies(tmp_path, address):
    """Bookie processes of the test on ``address``; every one is stopped at its end."""
    group = BookieProcesses(tmp_path, address)
    yield group
    group.close()


PASSWORD = b"cluster-test"


def payload(entry_id: int) -> bytes:
    """The content of entry ``entry_id`` in the cluster tests' ledgers."""
    return b"cluster entry %d " % entry_id * 16


class Writer:
    """A thread that adds :func:`payload` entries to ``handle`` with up to ``window`` in
    flight until :meth:`stop`; :attr:`acked` lists the ids acknowledged, in order, and
    ``on_done(entry_id, error)`` hears of each completion."""

    def __init__(self, handle, window: int = 64, on_done=None) -> None:
        self.handle = handle
        self._on_done = on_done
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self._submitted = self._completed = 0
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(window)
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._run, name="test-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_id = 0
        while not self._stop.is_set() and not self.errors:
            if not self._running.wait(0.1) or not self._slots.acquire(timeout=0.1):
                continue
            try:
                self.handle.add_entry_then(payload(next_id), self._done)
                self._submitted += 1
            except Exception as e:  # noqa: BLE001 - reported by stop()
                self.errors.append(e)
                return
            next_id += 1

    def _done(self, entry_id: int | None, error: BaseException | None) -> None:
        with self._lock:  # completions come on the client's threads
            if error is not None:
                self.errors.append(error)
            else:
                self.acked.append(entry_id)
            self._completed += 1
        if self._on_done is not None:
            self._on_done(entry_id, error)
        self._slots.release()

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` more entries than now are acknowledged."""
        target = len(self.acked) + count
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < target:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, \
                f"{len(self.acked)} of {target} entries acknowledged in {timeout_s} s"
            time.sleep(0.01)

    def pause(self) -> None:
        """Stop adding until :meth:`resume`; returns once nothing is in flight."""
        self._running.clear()
        self._drain()

    def resume(self) -> None:
        self._running.set()

    def stop(self, failures_ok: bool = False) -> list[int]:
        """Stop adding, wait for what is in flight (at most 30 s); raise the first failure
        unless ``failures_ok`` (then :attr:`errors` holds them)."""
        self._stop.set()
        self._thread.join(30)
        self._drain(failures_ok)
        return self.acked

    def _drain(self, failures_ok: bool = False) -> None:
        deadline = time.monotonic() + 30
        while self._completed < self._submitted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert failures_ok or not self.errors, self.errors
        assert self._completed == self._submitted, "adds still in flight after 30 s"


@contextlib.contextmanager
def serving_cluster(zookeeper, workdir: Path, count: int = 3) -> Iterator[str]:
    """A freshly formatted cluster on ``zookeeper`` with ``count`` bookies serving it from
    this process (:class:`~pybk.cluster.node.BookieNode`, each with its directories under
    ``workdir``), for tests about what a cluster does rather than about bookie processes
    (those use :class:`BookieProcesses`, which they can kill): no interpreter to start
    per bookie.  Yields its address; closes the bookies on exit."""
    address = zkutil.formatted_cluster(zookeeper)
    with contextlib.ExitStack() as nodes:
        for number in range(1, count + 1):
            settings = ServerSettings(
                metadataServiceUri=address, listenAddress="127.0.0.1:0",
                zkTimeout=zkutil.SESSION_TIMEOUT_MS, journalPreAllocSizeMB=1,
                journalDirectory=str(workdir / f"bookie{number}" / "journal"),
                ledgerDirectories=(str(workdir / f"bookie{number}" / "ledgers"),))
            format_bookie(settings)
            nodes.enter_context(BookieNode(settings))
        yield address


def run_child(main: Callable[[], None]) -> None:
    """Run a child script's ``main``: whatever it raises is printed and ends the process at
    once with status 2 (``os._exit``: the threads it started do not keep it alive)."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        os._exit(2)
