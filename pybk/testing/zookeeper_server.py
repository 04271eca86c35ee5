"""Throwaway ZooKeeper servers: a real ZooKeeper (Java) in child processes, for tests,
local clusters and benchmarks.  Never a production deployment.

Where ZooKeeper comes from (the first that exists wins)
    1. ``$PYBK_ZOOKEEPER_CLASSPATH``: a Java class path holding ZooKeeper and its
       dependencies (for a ZooKeeper unpacked by hand).
    2. The ``pyspark`` wheel: ``<site-packages>/pyspark/jars/`` ships
       ``zookeeper-3.9.*.jar`` with every dependency (``pip install pyspark``; pybk's
       ``test`` extra installs it).
    3. Debian's ``zookeeper`` package: ``/usr/share/java/zookeeper.jar``, whose manifest
       names its dependencies.
    Java is ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH`` (17 or later).

What one server keeps in its directory (a fresh temporary one unless given)
    ``zoo.cfg``               the configuration (loopback unless ``host`` says; four-letter words
                              ``ruok`` and ``srvr`` whitelisted; admin server off)
    ``log4j2.properties``     INFO to standard output (ZooKeeper 3.9 logs via log4j 2)
    ``zookeeper.log``         the process's standard output and error, appended to by
                              every start (:meth:`ZooKeeperServer.log_tail` reads it)
    ``data/``                 snapshots and transaction logs (``myid`` in an ensemble)

Readiness
    :meth:`ZooKeeperServer.start` returns once ``ruok`` answers ``imok`` and ``srvr``
    names the server's mode (standalone, leader or follower), i.e. it serves clients.
    Connecting a client any earlier can stall it for about 10 s.  The wait is bounded by
    ``start_timeout_s``; on failure the process is killed and
    :class:`~pybk.errors.ZooKeeperServerError` carries the tail of its log.

Life cycle
    Each server runs in its own process group.  :meth:`~ZooKeeperServer.shutdown` ends
    the group (SIGTERM, then SIGKILL after ``STOP_GRACE_S``; or SIGKILL at once, like a
    crash) and keeps port and data, so :meth:`~ZooKeeperServer.start` brings the same
    server back (:meth:`~ZooKeeperServer.restart` does both).  :meth:`~ZooKeeperServer.stop`
    also deletes a temporary directory.  Servers still running when the interpreter
    exits are stopped by an ``atexit`` hook.  If the process dies without running it
    (SIGKILL), the kernel kills the server (SIGKILL, ``PR_SET_PDEATHSIG``; see
    :mod:`pybk.cluster.lifeline`) on Linux when it was started from the main thread: the
    signal follows the thread that started the server, so one started from another
    thread gets none, and there, as on other systems, outlives a killed parent.
    ZooKeeper loses nothing it committed to a kill -9.

``force_sync=False`` passes ``-Dzookeeper.forceSync=no``: ZooKeeper then writes its
transaction log without fsync, which makes a test server several times faster and
loses nothing unless the machine itself crashes.
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Self, Sequence

from pybk.cluster.lifeline import death_signal_preexec
from pybk.errors import ZooKeeperServerError
from pybk.testing.processes import TempDirectoryProcesses

log = logging.getLogger(__name__)

CLASSPATH_ENV = "PYBK_ZOOKEEPER_CLASSPATH"
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
HOST = "127.0.0.1"

#: How long a server may take to exit after SIGTERM before it is killed.
STOP_GRACE_S = 5.0
#: How long one four-letter-word exchange may take.
FOUR_LETTER_TIMEOUT_S = 1.0
#: Pause between readiness probes.
PROBE_INTERVAL_S = 0.05
#: A server on a port picked here starts again on fresh ports this many times in all
#: if another process took the port between picking and binding.
START_ATTEMPTS_MAX = 3
#: Lines of the server's log quoted in an error.
LOG_TAIL_LINES = 40

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""

_running: "weakref.WeakSet[ZooKeeperServer]" = weakref.WeakSet()


def find_java() -> str:
    """The ``java`` executable, or ZooKeeperServerError saying how to get one."""
    home = os.environ.get("JAVA_HOME")
    candidates = [os.path.join(home, "bin", "java")] if home else []
    candidates.append(shutil.which("java") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ZooKeeperServerError("no Java runtime found (neither $JAVA_HOME/bin/java nor java on "
                               "PATH): install one, e.g. apt-get install default-jre-headless")


def find_classpath() -> str:
    """A Java class path that holds ZooKeeper's server and its dependencies; see the
    module docstring for where it is looked for."""
    explicit = os.environ.get(CLASSPATH_ENV)
    if explicit:
        return explicit
    spec = importlib.util.find_spec("pyspark")  # finds the wheel without importing Spark
    if spec is not None and spec.submodule_search_locations:
        for package_dir in spec.submodule_search_locations:
            jars = os.path.join(package_dir, "jars")
            if glob.glob(os.path.join(jars, "zookeeper-3.*.jar")):
                return os.path.join(jars, "*")
    if os.path.exists(DEBIAN_JAR):
        return DEBIAN_JAR
    raise ZooKeeperServerError(
        "ZooKeeper's jars were not found: pip install pyspark (its wheel ships them; pybk's "
        "'test' extra does this), apt-get install zookeeper, or set "
        f"{CLASSPATH_ENV} to a class path holding ZooKeeper and its dependencies")


def four_letter_word(port: int, word: str, timeout_s: float = FOUR_LETTER_TIMEOUT_S,
                     host: str = HOST) -> str:
    """Send a four-letter command to the server at ``host``:``port`` and return its whole
    answer ("" if it closed without one).  Raises OSError if it cannot be reached."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback right now (held open together so they
    differ; another process may still take one before the server binds it)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class _Peer:
    """One member of an ensemble: its id and ports."""

    server_id: int
    client_port: int
    peer_port: int
    election_port: int


class ZooKeeperServer(TempDirectoryProcesses):
    """One ZooKeeper server process.  A context manager: starts on enter, stops on exit.

    ``port`` 0 picks a free one.  ``tick_time_ms`` is ZooKeeper's ``tickTime``: sessions
    may time out after 2 to 300 ticks (``minSessionTimeout``, ``maxSessionTimeout``), so
    a small tick lets tests expire sessions quickly.  ``heap_mb`` caps the JVM's heap;
    ``jvm_options`` are more options of the ``java`` command (e.g. a short-lived test
    server's ``-XX:TieredStopAtLevel=1``, which starts it with less CPU).
    ``stop_grace_s`` is how long a graceful shutdown waits for the JVM to exit after
    SIGTERM before killing it (longer for a JVM that writes a class archive as it exits).
    ``host`` is the address it serves clients at (loopback by default), which this
    process must reach too (readiness probes); ``command_prefix`` goes before the
    ``java`` command and must exec it in the same process (e.g. ``ip netns exec NAME``,
    which runs it in a network namespace: tests/netbed.py).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, port: int = 0,
                 force_sync: bool = True, tick_time_ms: int = 2000, heap_mb: int = 256,
                 start_timeout_s: float = 60.0, jvm_options: Sequence[str] = (),
                 stop_grace_s: float = STOP_GRACE_S, host: str = HOST,
                 command_prefix: Sequence[str] = (), _peer: _Peer | None = None,
                 _ensemble: Sequence[_Peer] = ()) -> None:
        super().__init__(directory, "pybk-zk-")
        self.port = _peer.client_port if _peer else port
        self._picked_port = not self.port
        self.force_sync = force_sync
        self.tick_time_ms = tick_time_ms
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.jvm_options = tuple(jvm_options)
        self.stop_grace_s = stop_grace_s
        self.host = host
        self.command_prefix = tuple(command_prefix)
        self._peer = _peer
        self._ensemble = tuple(_ensemble)
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # -- addresses -------------------------------------------------------------------

    @property
    def connect_string(self) -> str:
        """``<host>:<port>`` (``127.0.0.1`` unless ``host`` says), as kazoo and ZooKeeper
        clients take it."""
        return f"{self.host}:{self.port}"

    def address(self, root: str = "/ledgers") -> str:
        """pybk's metadata address of a cluster rooted at ``root`` on this server."""
        return f"zk://{self.connect_string}{root}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "zookeeper.log")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- life cycle -----------------------------------------------------------------

    def start(self) -> Self:
        """Start the server (again) and wait until it serves; returns self."""
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the process without waiting (an ensemble launches every member first).
        Picks fresh ports while the server has never run and its port was picked here."""
        with self._lock:
            if self.running:
                return
            if self._picked_port and not os.path.exists(self._config_path):
                self.port = _free_ports(1)[0]
            self._write_config()
            self._spawn()

    def wait_ready(self) -> None:
        """Block until the server serves clients; raise ZooKeeperServerError (with the
        log tail, after killing it) if it exits or is not ready within the timeout."""
        deadline = time.monotonic() + self.start_timeout_s
        attempts = 1
        while True:
            process = self._process
            if process is None:
                raise ZooKeeperServerError(f"ZooKeeper in {self.directory} was not started")
            if process.poll() is not None:
                if (self._picked_port and attempts < START_ATTEMPTS_MAX
                        and "Address already in use" in self.log_tail()):
                    attempts += 1  # another process took the port first: take new ones
                    log.info("port %d was taken; starting ZooKeeper on another", self.port)
                    os.remove(self._config_path)
                    self.launch()
                    continue
                self._process = None
                raise ZooKeeperServerError(
                    f"ZooKeeper in {self.directory} exited with status {process.returncode} "
                    f"while starting; its log ends:\n{self.log_tail()}")
            if self._serves():
                return
            if time.monotonic() > deadline:
                self.shutdown(graceful=False)
                raise ZooKeeperServerError(
                    f"ZooKeeper on port {self.port} did not serve within "
                    f"{self.start_timeout_s:.0f} s; its log ends:\n{self.log_tail()}")
            time.sleep(PROBE_INTERVAL_S)

    def shutdown(self, graceful: bool = True) -> None:
        """End the server's process group (SIGKILL at once unless ``graceful``), keeping
        its port and data for :meth:`start`.  Harmless if it is not running."""
        with self._lock:
            process, self._process = self._process, None
            if process is None:
                return
            _running.discard(self)
            if graceful:
                _signal_group(process, signal.SIGTERM)
                try:
                    process.wait(self.stop_grace_s)
                except subprocess.TimeoutExpired:
                    log.warning("ZooKeeper pid %d ignored SIGTERM for %.0f s; killing it",
                                process.pid, self.stop_grace_s)
            # Also after a graceful exit: nothing of the group may outlive the server.
            _signal_group(process, signal.SIGKILL)
            process.wait()

    def restart(self, graceful: bool = True) -> None:
        """Shut the server down and start it again on the same port and data."""
        self.shutdown(graceful)
        self.start()

    def stop(self) -> None:
        """Shut the server down and delete its directory if it was a temporary one."""
        self.shutdown()
        self._remove_directory()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log ("" if there is none yet)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 200 * lines))
                text = f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"ZooKeeperServer({self.connect_string}, running={self.running})"

    # -- internals --------------------------------------------------------------------

    @property
    def _config_path(self) -> str:
        return os.path.join(self.directory, "zoo.cfg")

    def _write_config(self) -> None:
        data_dir = os.path.join(self.directory, "data")
        os.makedirs(data_dir, exist_ok=True)
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            f"maxSessionTimeout={300 * self.tick_time_ms}",
            "4lw.commands.whitelist=ruok,srvr",
            "admin.enableServer=false",  # its HTTP port (8080) would collide
        ]
        if self._peer is not None:
            lines += ["initLimit=10", "syncLimit=5"]
            lines += [f"server.{p.server_id}={HOST}:{p.peer_port}:{p.election_port}"
                      for p in self._ensemble]
            with open(os.path.join(data_dir, "myid"), "w", encoding="ascii") as f:
                f.write(f"{self._peer.server_id}\n")
        with open(self._config_path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(self.directory, "log4j2.properties"), "w",
                  encoding="utf-8") as f:
            f.write(_LOG4J2)

    def _spawn(self) -> None:
        command = [
            *self.command_prefix, find_java(), f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC",
            *self.jvm_options,
            "-Dlog4j2.configurationFile=" + os.path.join(self.directory, "log4j2.properties"),
            "-Dzookeeper.jmx.log4j.disable=true",
            *([] if self.force_sync else ["-Dzookeeper.forceSync=no"]),
            "-cp", find_classpath(),
            QUORUM_MAIN if self._peer is not None else STANDALONE_MAIN,
            self._config_path,
        ]
        with open(self.log_path, "ab") as out:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, cwd=self.directory,
                                             start_new_session=True,
                                             preexec_fn=death_signal_preexec(signal.SIGKILL))
        _running.add(self)
        log.info("started ZooKeeper pid %d on port %d in %s", self._process.pid, self.port,
                 self.directory)

    def _serves(self) -> bool:
        try:
            return (four_letter_word(self.port, "ruok", host=self.host) == "imok"
                    and "Mode: " in four_letter_word(self.port, "srvr", host=self.host))
        except OSError:
            return False


class ZooKeeperEnsemble(TempDirectoryProcesses):
    """``size`` ZooKeeper servers on loopback forming one ensemble (a quorum of
    ``size // 2 + 1``).  A context manager like :class:`ZooKeeperServer`; ``servers``
    are its members, which tests may shut down and start one by one."""

    def __init__(self, size: int = 3, directory: str | os.PathLike | None = None, *,
                 force_sync: bool = True, tick_time_ms: int = 2000, heap_mb: int = 256,
                 start_timeout_s: float = 60.0, jvm_options: Sequence[str] = ()) -> None:
        if size < 1:
            raise ValueError(f"an ensemble has at least one server, not {size}")
        super().__init__(directory, "pybk-zk-ensemble-")
        ports = _free_ports(3 * size)
        peers = [_Peer(i + 1, *ports[3 * i:3 * i + 3]) for i in range(size)]
        self.servers = [
            ZooKeeperServer(os.path.join(self.directory, f"server{p.server_id}"),
                            force_sync=force_sync, tick_time_ms=tick_time_ms,
                            heap_mb=heap_mb, start_timeout_s=start_timeout_s,
                            jvm_options=jvm_options, _peer=p, _ensemble=peers)
            for p in peers]

    @property
    def connect_string(self) -> str:
        """Every member's ``host:port``, comma-separated."""
        return ",".join(server.connect_string for server in self.servers)

    def address(self, root: str = "/ledgers") -> str:
        return f"zk://{self.connect_string}{root}"

    def start(self) -> Self:
        """Launch every member, then wait until each serves (a leader was elected)."""
        for server in self.servers:
            server.launch()
        for server in self.servers:
            server.wait_ready()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self._remove_directory()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the server leads its own group (start_new_session)
    except ProcessLookupError:
        pass


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        server.shutdown(graceful=False)
