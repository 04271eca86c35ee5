"""What the cluster commands of ``pybk`` do: ``bookie``, ``autorecovery``, ``updatecookie``,
``format-cluster``, ``localcluster``, ``simpletest`` and ``clean-orphans`` (:mod:`pybk.cli`
parses their arguments).

Every command that reaches a cluster takes the process's settings (``--conf``,
``--set``: :func:`pybk.cli.bookie_settings`), with their credentials: the CURVE key pair
(``zmqCurveEnabled``, ``zmqCurveSecretKeyFile``) and the ZooKeeper ones
(``zkEnableSecurity``, ``zkDigestAuthFile``).

Each returns the process's exit status: 0 on success, and after a graceful stop on
SIGTERM or SIGINT; 1 if the command failed, with the reason on standard error.  Lines
for people go to standard output.

Stopping (``bookie`` and ``localcluster``, :class:`_StopSignals`): the first SIGTERM or
SIGINT stops the command gracefully, also while it is still starting: the start is then
abandoned (a start waits on ZooKeeper, on journal replay, on processes, for many
seconds; a stop that waited for it to finish was a stop ignored).  A second signal stops
it at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pybk.cluster.lifeline import watch_lifeline
from pybk.errors import BookKeeperError
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import format_bookie
from pybk.storage.cookie import is_formatted

if TYPE_CHECKING:
    from pybk.meta.zookeeper import ZooKeeperSettings

#: How often a command waiting for a signal looks at what it runs.
_POLL_S = 0.2
#: How long a bookie whose lifeline broke (its parent died) may take to close before it
#: exits at once.  Its parent would have killed it after its own grace; with the parent
#: gone, the bookie bounds its close itself.  Nothing acknowledged is lost either way.
ORPHAN_GRACE_S = 10.0


class _Stopped(BaseException):
    """The first SIGTERM or SIGINT came while the command was starting.  Raised in the
    main thread, like KeyboardInterrupt (so no ``except Exception`` holds it up): what
    the start had opened is closed on the way out, as after a start that failed."""


class _StopNow(BaseException):
    """A second SIGTERM or SIGINT came (``pybk localcluster``: kill what it runs)."""


class _StopSignals:
    """What SIGTERM and SIGINT do while the block runs (the previous handlers are
    restored after it):

    1. the first, within :meth:`starting`: raise :class:`_Stopped` in the main thread.
       Python runs handlers there between bytecodes and wakes it from sleeps and waits,
       so the start is abandoned at once wherever it waits;
    2. the first, anywhere else: set :attr:`stop`, which the command waits on (a start
       begun after it raises _Stopped at once);
    3. the second, at any time: call ``stop_now(signal name)``, which ends the process
       or raises :class:`_StopNow`;
    4. any later one: nothing (the stop is under way, and bounded).
    """

    def __init__(self, stop_now: Callable[[str], None]) -> None:
        self.stop = threading.Event()
        self._stop_now = stop_now
        self._starting = False
        self._signals: list[str] = []
        self._previous: dict[int, Any] = {}

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """The block is the command's start, which the first signal abandons."""
        if self._signals:
            raise _Stopped(self._signals[0])
        self._starting = True
        try:
            yield
        finally:
            self._starting = False

    def _handle(self, signum: int, _frame: object) -> None:
        self._signals.append(signal.Signals(signum).name)
        if len(self._signals) == 1:
            self.stop.set()
            if self._starting:
                raise _Stopped(self._signals[0])
        elif len(self._signals) == 2:
            self._stop_now(self._signals[1])

    def __enter__(self) -> "_StopSignals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _failed(command: str, error: BaseException) -> int:
    print(f"pybk {command}: {error}", file=sys.stderr, flush=True)
    return 1


def _say(line: str) -> None:
    print(line, flush=True)


def run_bookie(settings: ServerSettings, format_new: bool = False,
               lifeline_fd: int | None = None) -> int:
    """Serve a bookie to the cluster at ``settings.metadataServiceUri`` until SIGTERM or
    SIGINT (then close it gracefully, or abandon its start: exit 0; a second signal
    exits at once, status 1) or until it shuts itself down (exit 1).  ``format_new``
    formats directories that hold no bookie yet.  ``lifeline_fd``, an inherited pipe's
    read end, stops the bookie like SIGTERM when it reads end-of-file (the parent holding
    the write end died; :mod:`pybk.cluster.lifeline`), and then exits at once if closing
    takes over :data:`ORPHAN_GRACE_S`."""
    from pybk.cluster.node import BookieNode  # ZeroMQ and kazoo only for this command

    if lifeline_fd is not None:
        try:
            os.fstat(lifeline_fd)
        except OSError as e:
            return _failed("bookie", BookKeeperError(
                f"--lifeline-fd {lifeline_fd} is not an open file descriptor ({e})"))
    with _StopSignals(_bookie_stop_now) as signals:
        if lifeline_fd is not None:
            watch_lifeline(lifeline_fd, lambda: _orphaned(signals.stop))
        node = None
        try:
            with signals.starting():
                if format_new and not is_formatted(settings):
                    format_bookie(settings)
                    _say(f"pybk bookie: formatted {settings.journalDirectory} and "
                         f"{', '.join(settings.ledgerDirectories)}")
                node = BookieNode(settings)
        except BookKeeperError as e:
            return _failed("bookie", e)
        except _Stopped as e:
            if node is not None:  # the start was over when the signal came
                node.close()
            _say(f"pybk bookie: {e} while starting: stopped")
            return 0
        if node.metrics_server is not None:
            _say(f"pybk bookie: metrics at http://{settings.prometheusStatsHttpAddress}:"
                 f"{node.metrics_server.port}/metrics")
        _say(f"pybk bookie: {node.bookie_id} serving at {node.endpoint}, registered in "
             f"{settings.metadataServiceUri}"
             + (f"; HTTP admin API at {node.http.url}" if node.http is not None else ""))
        _wait(signals.stop, node.wait)
        if signals.stop.is_set():
            _say(f"pybk bookie: {node.bookie_id} stopping (a second signal stops it at "
                 "once)")
        node.close()
    if node.shutdown_reason is not None:
        return _failed("bookie", BookKeeperError(f"{node.bookie_id} shut down: "
                                                 f"{node.shutdown_reason}"))
    _say(f"pybk bookie: {node.bookie_id} stopped")
    return 0


def run_autorecovery(settings: ServerSettings, candidate: str = "") -> int:
    """Stand for auditor in the cluster at ``settings.metadataServiceUri`` (audit it
    while elected, and re-replicate what is marked: :mod:`pybk.autorecovery.service`)
    until SIGTERM or SIGINT: exit 0; a second signal exits at once (1).
    ``candidate`` names this process in the election (default:
    ``<host>-autorecovery-<pid>``)."""
    from pybk.autorecovery.service import AutoRecovery
    from pybk.meta.address import open_metadata_store
    from pybk.meta.zookeeper import ZooKeeperSettings

    candidate = candidate or f"{socket.gethostname()}-autorecovery-{os.getpid()}"
    if not settings.metadataServiceUri:
        return _failed("autorecovery", BookKeeperError(
            "no cluster given: pass --zk zk://host:port/ledgers (metadataServiceUri)"))
    with _StopSignals(_autorecovery_stop_now) as signals, contextlib.ExitStack() as opened:
        try:
            with signals.starting():
                store = opened.enter_context(open_metadata_store(
                    settings.metadataServiceUri,
                    ZooKeeperSettings.of(settings)))
                opened.enter_context(AutoRecovery(store, settings, candidate))
        except BookKeeperError as e:
            return _failed("autorecovery", e)
        except _Stopped as e:
            _say(f"pybk autorecovery: {e} while starting: stopped")
            return 0
        _say(f"pybk autorecovery: {candidate} standing for auditor in "
             f"{settings.metadataServiceUri}")
        while not signals.stop.wait(_POLL_S):
            pass
        _say(f"pybk autorecovery: {candidate} stopping")
    _say(f"pybk autorecovery: {candidate} stopped")
    return 0


def run_updatecookie(settings: ServerSettings) -> int:
    """Accept a bookie's directories moved on purpose to where ``settings`` name them:
    rewrite their cookies and, with ``metadataServiceUri``, the cluster's copy
    (:func:`pybk.cluster.cookies.update_cookies`)."""
    from pybk.cluster.cookies import update_cookies
    from pybk.meta.address import open_metadata_store
    from pybk.meta.zookeeper import ZooKeeperSettings

    try:
        with contextlib.ExitStack() as opened:
            store = None
            if settings.metadataServiceUri:
                store = opened.enter_context(open_metadata_store(
                    settings.metadataServiceUri,
                    ZooKeeperSettings.of(settings)))
            cookie = update_cookies(settings, store)
    except BookKeeperError as e:
        return _failed("updatecookie", e)
    who = f"bookie {cookie.bookie_id}" if cookie.bookie_id else "the bookie"
    _say(f"pybk updatecookie: {who} (instance {cookie.instance_id}): its cookies name "
         f"{cookie.describe_paths()}"
         + (f", in its directories and in {settings.metadataServiceUri}"
            if cookie.bookie_id else ""))
    return 0


def run_format_cluster(address: str, layout: str,
                       settings: ServerSettings | None = None) -> int:
    """Format the cluster at ``address`` (harmless if it is, with the same layout), as
    the ZooKeeper settings among ``settings`` say (with ``zkEnableSecurity`` its znodes
    get pybk's ACLs)."""
    from pybk.meta.zookeeper import ZooKeeperSettings, format_cluster

    try:
        instance_id = format_cluster(address, layout,
                                     ZooKeeperSettings.of(settings or ServerSettings()))
    except BookKeeperError as e:
        return _failed("format-cluster", e)
    _say(f"pybk format-cluster: {address} is formatted ({layout} layout, instance id "
         f"{instance_id})")
    return 0


def run_migrate_logs(address: str, logs: list[str] | None,
                     settings: ServerSettings | None = None) -> int:
    """Move the cluster at ``address`` into pybk's current ZooKeeper layout with the
    former layout's logs named in ``logs`` (all of them when None), and say what moved
    (:func:`pybk.meta.zookeeper.migrate_logs`)."""
    from pybk.meta.zookeeper import ZooKeeperSettings, migrate_logs

    try:
        migration = migrate_logs(address, logs,
                                 ZooKeeperSettings.of(settings or ServerSettings()))
    except BookKeeperError as e:
        return _failed("migrate-logs", e)
    _say(f"pybk migrate-logs: {address}: "
         f"{migration or 'in the current layout already: nothing to move'}")
    return 0


def run_keygen(directory: str, name: str) -> int:
    """Write a CURVE key pair, ``NAME.key`` and ``NAME.key_secret``, into ``directory``
    (:func:`pybk.net.curve.create_key_pair`); never overwrites one."""
    from pybk.net.curve import create_key_pair

    try:
        public, secret = create_key_pair(directory, name)
    except (BookKeeperError, OSError) as e:
        return _failed("keygen", e)
    _say(f"pybk keygen: public key {public} (copy it into the bookies' "
         f"zmqCurveAllowedClientKeysDirectory), key pair {secret} (zmqCurveSecretKeyFile; "
         "keep it private)")
    return 0


#: What ``pybk compaction`` waits for a bookie's HTTP admin server, in seconds.
COMPACTION_REQUEST_TIMEOUT_S = 30.0


def run_compaction(action: str, url: str, major: bool, minor: bool,
                   as_json: bool = False) -> int:
    """``pybk compaction status|suspend|resume``: a bookie's compactions, through its HTTP
    admin API (``gc/suspend_compaction``, ``gc/resume_compaction``; the admin token from
    ``PYBK_httpServerAdminToken``).  Neither ``major`` nor ``minor``: both."""
    import json
    import urllib.error
    import urllib.request

    if not (major or minor):
        major = minor = True
    base = url.rstrip("/") + "/api/v1/bookie/gc/"
    if action == "status":
        request = urllib.request.Request(base + "suspend_compaction")
    else:
        word = "suspend" if action == "suspend" else "resume"
        body = {f"{word}Major": str(major).lower(), f"{word}Minor": str(minor).lower()}
        request = urllib.request.Request(f"{base}{word}_compaction", method="PUT",
                                         data=json.dumps(body).encode())
        token = os.environ.get("PYBK_httpServerAdminToken")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=COMPACTION_REQUEST_TIMEOUT_S) as answer:
            state = json.loads(answer.read())
    except urllib.error.HTTPError as e:
        with e:
            text = e.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, TypeError, KeyError):
            text = json.loads(text)["message"]
        return _failed("compaction", BookKeeperError(f"{url} answered {e.code}: {text}"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        return _failed("compaction", BookKeeperError(f"cannot reach {url}: {e}"))
    if as_json:
        _say(json.dumps(state, sort_keys=True))
        return 0
    said = {kind: "suspended" if state[f"is{kind.title()}GcSuspended"] == "true" else "runs"
            for kind in ("major", "minor")}
    _say(f"major compaction {said['major']}, minor compaction {said['minor']}")
    return 0


def run_localcluster(bookies: int, directory: str | None,
                     settings: ServerSettings | None = None, settings_args: Sequence[str] = (),
                     curve: bool = False, zk_auth: bool = False) -> int:
    """Run a :class:`~pybk.testing.local_cluster.LocalCluster` until SIGTERM or SIGINT, then stop
    it gracefully (exit 0); a second signal kills its processes at once (exit 1).
    ``settings_args`` (``--conf``, ``--set``) go to every bookie, ``settings`` are what
    they make; ``curve`` and ``zk_auth`` secure the cluster
    (:mod:`pybk.testing.local_security`)."""
    from pybk.testing.local_cluster import LocalCluster

    with _StopSignals(_raise_stop_now) as signals:
        cluster = LocalCluster(bookies, directory, bookie_args=settings_args,
                               settings=settings, curve=curve, zk_auth=zk_auth)
        try:
            try:
                with signals.starting():
                    cluster.start()
                _say(f"pybk localcluster: ZooKeeper at {cluster.address}")
                for bookie_id, endpoint in sorted(cluster.endpoints.items()):
                    _say(f"pybk localcluster: bookie {bookie_id} at {endpoint}")
                secured = cluster.settings.zmqCurveEnabled or cluster.settings.zkEnableSecurity
                where = f"--conf {cluster.client_conf}" if secured else f"--zk {cluster.address}"
                _say(f"pybk localcluster: data in {cluster.directory}\n"
                     + (f"  secured: {_security(cluster.settings)}; a client's settings "
                        f"(address and credentials) are in {cluster.client_conf}\n"
                        if secured else "")
                     + f"  try:     pybk simpletest {where}\n"
                     f"           pybk listbookies {where}\n"
                     + ("" if secured else f"  Python:  pybk.connect({cluster.address!r})\n")
                     + "  Ctrl-C (or SIGTERM) stops the cluster")
                while not signals.stop.wait(_POLL_S):
                    pass
                _say("pybk localcluster: stopping (Ctrl-C again kills it at once)")
            except _Stopped as e:
                _say(f"pybk localcluster: {e} while starting: stopping (Ctrl-C again "
                     "kills it at once)")
            except BookKeeperError as e:
                return _failed("localcluster", e)
            finally:
                cluster.stop()
        except _StopNow:
            cluster.stop(grace_s=0)
            _say("pybk localcluster: killed")
            return 1
    _say("pybk localcluster: stopped")
    return 0


def _security(settings: ServerSettings) -> str:
    """What secures a local cluster, for people."""
    parts = []
    if settings.zmqCurveEnabled:
        parts.append(f"CURVE (bookie key pair {settings.zmqCurveSecretKeyFile}, allowed "
                     f"client keys in {settings.zmqCurveAllowedClientKeysDirectory})")
    if settings.zkEnableSecurity:
        parts.append(f"ZooKeeper digest ACLs (credentials in {settings.zkDigestAuthFile})")
    return " and ".join(parts)


def _client_settings(settings: ServerSettings) -> tuple[ClientSettings, ZooKeeperSettings]:
    """The client and ZooKeeper settings of a command run with ``settings``: its CURVE
    key pair and ZooKeeper credentials."""
    from pybk.meta.zookeeper import ZooKeeperSettings
    from pybk.net.curve import client_settings_of

    return (ClientSettings(**client_settings_of(settings)), ZooKeeperSettings.of(settings))


def run_simpletest(settings: ServerSettings, ensemble: int, write_quorum: int,
                   ack_quorum: int, entries: int, entry_bytes: int) -> int:
    """Write a ledger on the cluster at ``settings.metadataServiceUri`` and read it back,
    with the credentials of ``settings``."""
    from pybk.admin.simpletest import simple_test

    try:
        client, zookeeper = _client_settings(settings)
        report = simple_test(settings.metadataServiceUri, ensemble, write_quorum, ack_quorum,
                             entries, entry_bytes, client, zk_settings=zookeeper)
    except BookKeeperError as e:
        return _failed("simpletest", e)
    _say(f"pybk simpletest: {report}")
    return 0


def run_clean_orphans(settings: ServerSettings, log_name: str, older_than_s: float) -> int:
    """Give up the jobs of a log on the cluster at ``settings.metadataServiceUri`` that
    nothing wrote for ``older_than_s`` seconds (:func:`pybk.log.commit.clean_orphans`),
    with the credentials of ``settings``."""
    from pybk.log.commit import clean_orphans
    from pybk.net.connect import connect

    try:
        client, zookeeper = _client_settings(settings)
        with connect(settings.metadataServiceUri, client, zk_settings=zookeeper) as bk:
            given_up = clean_orphans(bk, log_name, older_than_s)
    except BookKeeperError as e:
        return _failed("clean-orphans", e)
    _say(f"pybk clean-orphans: log {log_name}: {len(given_up)} orphan jobs given up"
         + "".join(f"\n  {job_id}" for job_id in given_up))
    return 0


def _orphaned(stop: threading.Event) -> None:
    """The lifeline broke: stop as on SIGTERM, but within ORPHAN_GRACE_S.  (Not a signal
    of its own: on Linux the death signal, a SIGTERM, comes too, and two signals would
    stop the bookie at once instead of gracefully.)"""
    print("pybk bookie: the parent process is gone (lifeline closed): stopping",
          file=sys.stderr, flush=True)
    stop.set()
    why = f"not closed within {ORPHAN_GRACE_S:.0f} s of losing its parent"
    timer = threading.Timer(ORPHAN_GRACE_S, _exit_now, [why])
    timer.name = "pybk-orphan-grace"
    timer.daemon = True
    timer.start()


def _bookie_stop_now(signal_name: str) -> None:
    _exit_now(f"a second signal ({signal_name})")


def _autorecovery_stop_now(signal_name: str) -> None:
    os.write(2, f"pybk autorecovery: a second signal ({signal_name}): exiting now\n".encode())
    os._exit(1)


def _raise_stop_now(signal_name: str) -> None:
    raise _StopNow(signal_name)


def _exit_now(why: str) -> None:
    # os.write: this may run in a signal handler that interrupted a print to stderr
    os.write(2, f"pybk bookie: {why}: exiting now (the journal keeps everything "
                "acknowledged)\n".encode())
    os._exit(1)


def _wait(stop: threading.Event, done: Callable[[float], bool]) -> None:
    """Until ``stop`` is set or ``done(timeout)`` says the work ended by itself."""
    while not stop.is_set() and not done(_POLL_S):
        pass
