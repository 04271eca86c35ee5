"""The bookie and cluster commands of ``pybk``: ``bookie``, ``autorecovery``,
``updatecookie``, ``format-cluster``, ``migrate-logs``, ``localcluster``, ``keygen``,
``compaction``, ``simpletest`` and ``clean-orphans``.

Every command that reaches a cluster takes the process's settings (``--conf``,
``--set``: :func:`pybk.cli.options.bookie_settings`), with their credentials: the CURVE
key pair (``zmqCurveEnabled``, ``zmqCurveSecretKeyFile``) and the ZooKeeper ones
(``zkEnableSecurity``, ``zkDigestAuthFile``).  ``autorecovery enable|disable|status``
is the admin shell's (:mod:`pybk.cli.admin`).

Each returns the process's exit status: 0 on success, and after a graceful stop on
SIGTERM or SIGINT; 1 if the command failed, with one line ``pybk COMMAND: reason`` on
standard error (:func:`pybk.cli.output.fail`).  Lines for people go to standard output.

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

from pybk.cli import admin, options
from pybk.cli.output import fail, run, say
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


def add_commands(commands: Any) -> None:
    """Add the bookie and cluster commands to the ``pybk`` parser's ``commands``."""
    bookie = commands.add_parser(
        "bookie", help="serve a bookie to a cluster until SIGTERM or SIGINT",
        description="Serve a bookie: check its cookies, register it in ZooKeeper, serve "
                    "over ZeroMQ; SIGTERM or SIGINT unregisters it and closes it gracefully.")
    bookie.add_argument("--zk", metavar="ADDRESS",
                        help=f"{options.CLUSTER_HELP} (setting metadataServiceUri)")
    bookie.add_argument("--listen", metavar="HOST:PORT",
                        help="where to serve; port 0 picks a free one (listenAddress, "
                             "default 127.0.0.1:3181)")
    bookie.add_argument("--journal-dir", help="the journal directory (journalDirectory)")
    bookie.add_argument("--ledger-dir", action="append", default=[],
                        help="a ledger directory; repeat for several (ledgerDirectories)")
    bookie.add_argument("--bookie-id", help="the bookie's id (bookieId; default: host:port)")
    bookie.add_argument("--format", action="store_true",
                        help="format the directories first if they hold no bookie yet")
    options.add_settings(bookie)
    bookie.add_argument("--lifeline-fd", type=int, metavar="FD",
                        help="an inherited pipe's read end: stop as on SIGTERM when it "
                             "reads end-of-file, i.e. when the parent holding its write "
                             "end exits (pybk localcluster passes one)")
    bookie.set_defaults(run=lambda a: run_bookie(options.settings_of(a), a.format,
                                                 a.lifeline_fd))

    recovery = commands.add_parser(
        "autorecovery", help="stand for auditor in a cluster and repair what is marked",
        description="Autorecovery as a process of its own (bookies run it too, with "
                    "autoRecoveryDaemonEnabled): take part in the auditor election and, "
                    "while elected, mark the ledgers of lost bookies under-replicated; "
                    "run a replication worker that re-replicates the marked ledgers "
                    "(unless replicationWorkerEnabled=false). SIGTERM or SIGINT stops it.")
    recovery.add_argument("--zk", metavar="ADDRESS",
                          help=f"{options.CLUSTER_HELP} (metadataServiceUri)")
    recovery.add_argument("--id", help="this process's name in the auditor election "
                                       "(default: <host>-autorecovery-<pid>)")
    options.add_settings(recovery)
    recovery.add_argument("action", nargs="?", choices=admin.AUTORECOVERY_ACTIONS,
                          help="instead of running: turn automatic re-replication on "
                               "(enable) or off (disable) cluster-wide, or show which "
                               "(status)")
    recovery.add_argument("--json", action="store_true",
                          help="with an action: answer in JSON")
    recovery.set_defaults(run=lambda a: admin.run_autorecovery(a) if a.action else
                          run_autorecovery(options.settings_of(a), a.id or ""))

    update = commands.add_parser(
        "updatecookie", help="accept a bookie's directories moved on purpose",
        description="After moving a stopped bookie's directories: check that they are "
                    "its own (one instance id, as the cluster knows it) and rewrite their "
                    "cookies and the cluster's copy with the new paths.")
    update.add_argument("--zk", metavar="ADDRESS",
                        help="the cluster, to update its copy of the cookie too "
                             "(metadataServiceUri)")
    update.add_argument("--journal-dir", help="the journal directory's new path")
    update.add_argument("--ledger-dir", action="append", default=[],
                        help="a ledger directory's new path, in the former order; repeat "
                             "for several")
    update.add_argument("--bookie-id", help="the bookie's id, only for directories whose "
                                            "cookies record none (older pybk)")
    options.add_settings(update)
    update.set_defaults(run=lambda a: run_updatecookie(options.settings_of(a)))

    format_cmd = commands.add_parser(
        "format-cluster", help="format a cluster's metadata on ZooKeeper (once)")
    format_cmd.add_argument("--zk", metavar="ADDRESS", required=True,
                            help="zk://host:port[,host:port...]/ledgers")
    format_cmd.add_argument("--layout", choices=("hierarchical", "flat"),
                            default="hierarchical", help="the ledger layout")
    options.add_settings(format_cmd)  # zkEnableSecurity: its znodes get ACLs
    format_cmd.set_defaults(run=lambda a: run_format_cluster(a.zk, a.layout,
                                                             options.settings_of(a)))

    migrate = commands.add_parser(
        "migrate-logs", help="move a cluster's logs from pybk's former ZooKeeper layout "
                             "(beside the root) under its root")
    migrate.add_argument("--zk", metavar="ADDRESS", required=True,
                         help="zk://host:port[,host:port...]/root")
    migrate.add_argument("--logs", metavar="NAME,...",
                         help="the logs this cluster takes, comma-separated (empty: "
                              "none); default: all, if no other cluster of the former "
                              "layout shares the parent")
    options.add_settings(migrate)
    migrate.set_defaults(run=lambda a: run_migrate_logs(
        a.zk, None if a.logs is None else [n for n in a.logs.split(",") if n],
        options.settings_of(a)))

    local = commands.add_parser(
        "localcluster", help="a throwaway ZooKeeper and N bookies on loopback")
    local.add_argument("bookies", type=options.positive(int), metavar="N",
                       help="how many bookies")
    local.add_argument("--dir", help="where their data goes (default: a temporary "
                                     "directory, removed at the end)")
    local.add_argument("--curve", action="store_true",
                       help="serve every bookie with ZeroMQ CURVE (zmqCurveEnabled); key "
                            "pairs are made in the data directory unless the settings name "
                            "them")
    local.add_argument("--zk-auth", action="store_true",
                       help="format the cluster with ZooKeeper digest ACLs "
                            "(zkEnableSecurity); the credentials are made in the data "
                            "directory unless zkDigestAuthFile names them")
    options.add_settings(local, "a bk_server.conf-style key=value settings file for "
                                "every bookie")
    local.set_defaults(run=lambda a: run_localcluster(
        a.bookies, a.dir, options.settings_of(a), options.settings_args(a), a.curve,
        a.zk_auth))

    keygen = commands.add_parser(
        "keygen", help="write a ZeroMQ CURVE key pair for a bookie or a client",
        description="Write NAME.key (the public key: give it to the bookies that should "
                    "accept this process, in their zmqCurveAllowedClientKeysDirectory) and "
                    "NAME.key_secret (the key pair, readable by its owner only: this "
                    "process's zmqCurveSecretKeyFile) into DIR.  Refuses to overwrite.")
    keygen.add_argument("dir", metavar="DIR", help="where the files go (made if missing)")
    keygen.add_argument("name", metavar="NAME", help="the files' name, e.g. bookie1")
    keygen.set_defaults(run=lambda a: run_keygen(a.dir, a.name))

    compaction = commands.add_parser(
        "compaction", help="suspend or resume a bookie's compactions (maintenance)",
        description="Show, suspend or resume the compactions of a running bookie, through "
                    "its HTTP admin API (httpServerEnabled): suspended ones are not started, "
                    "scheduled or forced, until resumed or the bookie restarts; entry logs "
                    "of deleted ledgers are still removed.  suspend and resume need the "
                    "admin token, from the environment: PYBK_httpServerAdminToken.")
    compaction.add_argument("action", choices=("status", "suspend", "resume"))
    compaction.add_argument("--url", required=True, metavar="URL",
                            help="the bookie's HTTP admin server, e.g. http://host:8080")
    compaction.add_argument("--major", action="store_true",
                            help="major compaction only (default: both)")
    compaction.add_argument("--minor", action="store_true",
                            help="minor compaction only (default: both)")
    compaction.add_argument("--json", action="store_true",
                            help="the bookie's answer as JSON")
    compaction.set_defaults(run=lambda a: run_compaction(a.action, a.url, a.major, a.minor,
                                                         a.json))

    simple = commands.add_parser(
        "simpletest", help="write a ledger on a cluster and read it back")
    options.add_cluster(simple)
    count = options.positive(int)
    simple.add_argument("--ensemble", type=count, default=3, help="ensemble size E")
    simple.add_argument("--write-quorum", type=count, default=2, help="write quorum Qw")
    simple.add_argument("--ack-quorum", type=count, default=2, help="ack quorum Qa")
    simple.add_argument("--entries", type=count, default=1000, help="how many entries")
    simple.add_argument("--entry-size", type=count, default=1024, help="bytes per entry")
    simple.set_defaults(run=lambda a: run_simpletest(
        options.settings_of(a, needs_cluster=True), a.ensemble, a.write_quorum,
        a.ack_quorum, a.entries, a.entry_size))

    orphans = commands.add_parser(
        "clean-orphans", help="delete what jobs whose driver died left on a log")
    orphans.add_argument("log", help="the log's name")
    options.add_cluster(orphans)
    orphans.add_argument("--older-than", type=options.positive(float), default=600.0,
                         metavar="SECONDS", help="give up jobs nothing wrote for this long "
                         "(default 600, the orphanTimeoutSeconds default)")
    orphans.set_defaults(run=lambda a: run_clean_orphans(
        options.settings_of(a, needs_cluster=True), a.log, a.older_than))


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
            return fail("bookie", BookKeeperError(
                f"--lifeline-fd {lifeline_fd} is not an open file descriptor ({e})"))
    with _StopSignals(_bookie_stop_now) as signals:
        if lifeline_fd is not None:
            watch_lifeline(lifeline_fd, lambda: _orphaned(signals.stop))
        node = None
        try:
            with signals.starting():
                if format_new and not is_formatted(settings):
                    format_bookie(settings)
                    say(f"pybk bookie: formatted {settings.journalDirectory} and "
                        f"{', '.join(settings.ledgerDirectories)}")
                node = BookieNode(settings)
        except BookKeeperError as e:
            return fail("bookie", e)
        except _Stopped as e:
            if node is not None:  # the start was over when the signal came
                node.close()
            say(f"pybk bookie: {e} while starting: stopped")
            return 0
        if node.metrics_server is not None:
            say(f"pybk bookie: metrics at http://{settings.prometheusStatsHttpAddress}:"
                f"{node.metrics_server.port}/metrics")
        say(f"pybk bookie: {node.bookie_id} serving at {node.endpoint}, registered in "
            f"{settings.metadataServiceUri}"
            + (f"; HTTP admin API at {node.http.url}" if node.http is not None else ""))
        _wait(signals.stop, node.wait)
        if signals.stop.is_set():
            say(f"pybk bookie: {node.bookie_id} stopping (a second signal stops it at "
                "once)")
        node.close()
    if node.shutdown_reason is not None:
        return fail("bookie", BookKeeperError(f"{node.bookie_id} shut down: "
                                              f"{node.shutdown_reason}"))
    say(f"pybk bookie: {node.bookie_id} stopped")
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
        return fail("autorecovery", BookKeeperError(
            "no cluster given: pass --zk zk://host:port/ledgers (metadataServiceUri)"))
    with _StopSignals(_autorecovery_stop_now) as signals, contextlib.ExitStack() as opened:
        try:
            with signals.starting():
                store = opened.enter_context(open_metadata_store(
                    settings.metadataServiceUri,
                    ZooKeeperSettings.of(settings)))
                opened.enter_context(AutoRecovery(store, settings, candidate))
        except BookKeeperError as e:
            return fail("autorecovery", e)
        except _Stopped as e:
            say(f"pybk autorecovery: {e} while starting: stopped")
            return 0
        say(f"pybk autorecovery: {candidate} standing for auditor in "
            f"{settings.metadataServiceUri}")
        while not signals.stop.wait(_POLL_S):
            pass
        say(f"pybk autorecovery: {candidate} stopping")
    say(f"pybk autorecovery: {candidate} stopped")
    return 0


def run_updatecookie(settings: ServerSettings) -> int:
    """Accept a bookie's directories moved on purpose to where ``settings`` name them:
    rewrite their cookies and, with ``metadataServiceUri``, the cluster's copy
    (:func:`pybk.cluster.cookies.update_cookies`)."""
    from pybk.cluster.cookies import update_cookies
    from pybk.meta.address import open_metadata_store
    from pybk.meta.zookeeper import ZooKeeperSettings

    def update() -> Any:
        with contextlib.ExitStack() as opened:
            store = None
            if settings.metadataServiceUri:
                store = opened.enter_context(open_metadata_store(
                    settings.metadataServiceUri,
                    ZooKeeperSettings.of(settings)))
            return update_cookies(settings, store)

    def updated(cookie: Any) -> list[str]:
        who = f"bookie {cookie.bookie_id}" if cookie.bookie_id else "the bookie"
        return [f"pybk updatecookie: {who} (instance {cookie.instance_id}): its cookies "
                f"name {cookie.describe_paths()}"
                + (f", in its directories and in {settings.metadataServiceUri}"
                   if cookie.bookie_id else "")]
    return run("updatecookie", update, updated, as_json=False)


def run_format_cluster(address: str, layout: str,
                       settings: ServerSettings | None = None) -> int:
    """Format the cluster at ``address`` (harmless if it is, with the same layout), as
    the ZooKeeper settings among ``settings`` say (with ``zkEnableSecurity`` its znodes
    get pybk's ACLs)."""
    from pybk.meta.zookeeper import ZooKeeperSettings, format_cluster

    return run("format-cluster", lambda: format_cluster(
        address, layout, ZooKeeperSettings.of(settings or ServerSettings())),
        lambda instance_id: [f"pybk format-cluster: {address} is formatted ({layout} "
                             f"layout, instance id {instance_id})"], as_json=False)


def run_migrate_logs(address: str, logs: list[str] | None,
                     settings: ServerSettings | None = None) -> int:
    """Move the cluster at ``address`` into pybk's current ZooKeeper layout with the
    former layout's logs named in ``logs`` (all of them when None), and say what moved
    (:func:`pybk.meta.zookeeper.migrate_logs`)."""
    from pybk.meta.zookeeper import ZooKeeperSettings, migrate_logs

    return run("migrate-logs", lambda: migrate_logs(
        address, logs, ZooKeeperSettings.of(settings or ServerSettings())),
        lambda migration: [f"pybk migrate-logs: {address}: "
                           f"{migration or 'in the current layout already: nothing to move'}"],
        as_json=False)


def run_keygen(directory: str, name: str) -> int:
    """Write a CURVE key pair, ``NAME.key`` and ``NAME.key_secret``, into ``directory``
    (:func:`pybk.net.curve.create_key_pair`); never overwrites one."""
    from pybk.net.curve import create_key_pair

    return run("keygen", lambda: create_key_pair(directory, name),
               lambda paths: [f"pybk keygen: public key {paths[0]} (copy it into the "
                              "bookies' zmqCurveAllowedClientKeysDirectory), key pair "
                              f"{paths[1]} (zmqCurveSecretKeyFile; keep it private)"],
               as_json=False)


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
        return fail("compaction", BookKeeperError(f"{url} answered {e.code}: {text}"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        return fail("compaction", BookKeeperError(f"cannot reach {url}: {e}"))
    if as_json:
        say(json.dumps(state, sort_keys=True))
        return 0
    said = {kind: "suspended" if state[f"is{kind.title()}GcSuspended"] == "true" else "runs"
            for kind in ("major", "minor")}
    say(f"major compaction {said['major']}, minor compaction {said['minor']}")
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
                say(f"pybk localcluster: ZooKeeper at {cluster.address}")
                for bookie_id, endpoint in sorted(cluster.endpoints.items()):
                    say(f"pybk localcluster: bookie {bookie_id} at {endpoint}")
                secured = cluster.settings.zmqCurveEnabled or cluster.settings.zkEnableSecurity
                where = f"--conf {cluster.client_conf}" if secured else f"--zk {cluster.address}"
                say(f"pybk localcluster: data in {cluster.directory}\n"
                    + (f"  secured: {_security(cluster.settings)}; a client's settings "
                       f"(address and credentials) are in {cluster.client_conf}\n"
                       if secured else "")
                    + f"  try:     pybk simpletest {where}\n"
                    f"           pybk listbookies {where}\n"
                    + ("" if secured else f"  Python:  pybk.connect({cluster.address!r})\n")
                    + "  Ctrl-C (or SIGTERM) stops the cluster")
                while not signals.stop.wait(_POLL_S):
                    pass
                say("pybk localcluster: stopping (Ctrl-C again kills it at once)")
            except _Stopped as e:
                say(f"pybk localcluster: {e} while starting: stopping (Ctrl-C again "
                    "kills it at once)")
            except BookKeeperError as e:
                return fail("localcluster", e)
            finally:
                cluster.stop()
        except _StopNow:
            cluster.stop(grace_s=0)
            say("pybk localcluster: killed")
            return 1
    say("pybk localcluster: stopped")
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

    def test() -> Any:
        client, zookeeper = _client_settings(settings)  # reads the key pair: may fail
        return simple_test(settings.metadataServiceUri, ensemble, write_quorum, ack_quorum,
                           entries, entry_bytes, client, zk_settings=zookeeper)
    return run("simpletest", test, lambda report: [f"pybk simpletest: {report}"],
               as_json=False)


def run_clean_orphans(settings: ServerSettings, log_name: str, older_than_s: float) -> int:
    """Give up the jobs of a log on the cluster at ``settings.metadataServiceUri`` that
    nothing wrote for ``older_than_s`` seconds (:func:`pybk.log.commit.clean_orphans`),
    with the credentials of ``settings``."""
    from pybk.log.commit import clean_orphans
    from pybk.net.connect import connect

    def clean() -> list[str]:
        client, zookeeper = _client_settings(settings)
        with connect(settings.metadataServiceUri, client, zk_settings=zookeeper) as bk:
            return clean_orphans(bk, log_name, older_than_s)
    return run("clean-orphans", clean, lambda given_up: [
        f"pybk clean-orphans: log {log_name}: {len(given_up)} orphan jobs given up"]
        + [f"  {job_id}" for job_id in given_up], as_json=False)


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
