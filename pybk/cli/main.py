"""The ``pybk`` command.

``pybk demo``
    The embedded WAL: appends, kill -9, restart, verify every record (:mod:`pybk.cli.demo`).
``pybk demote DIR``
    Turn a promoted WAL directory whose cluster is gone back into an embedded WAL
    (:func:`pybk.demote`).
``pybk tail DIR [--from POS] [--follow]``
    A WAL's records, also while its application has it open (:mod:`pybk.cli.wal`).
``pybk bookie``
    A bookie serving a cluster until SIGTERM or SIGINT (:class:`pybk.cluster.node.BookieNode`).
``pybk autorecovery``
    Stand for auditor in a cluster, audit it while elected, and re-replicate the ledgers
    marked (:mod:`pybk.autorecovery.service`; bookies do it too unless
    ``autoRecoveryDaemonEnabled`` is false).
``pybk updatecookie``
    Accept a bookie's directories moved on purpose: rewrite its cookies and the cluster's
    copy (:func:`pybk.cluster.cookies.update_cookies`, BookKeeper's ``updatecookie``).
``pybk format-cluster``
    Format a cluster's metadata on ZooKeeper, once per cluster (with
    ``zkEnableSecurity``, its znodes get pybk's ACLs: :mod:`pybk.meta.zkclient`).
``pybk migrate-logs --zk ADDRESS [--logs NAME,...]``
    Move a cluster of pybk's former ZooKeeper layout (logs beside the root) under its
    root with the logs named (all when not given): for clusters that shared their logs,
    which opening refuses to move (:mod:`pybk.meta.migrate`).
``pybk keygen DIR NAME``
    Write a ZeroMQ CURVE key pair, ``NAME.key`` and ``NAME.key_secret``
    (:mod:`pybk.net.curve`).
``pybk localcluster N``
    A throwaway ZooKeeper and N bookie processes on loopback (:mod:`pybk.testing.local_cluster`).
``pybk simpletest``
    Write a ledger on a cluster, read it back, report the rates.
``pybk consumers list|remove``
    A log's consumers and their committed positions, which hold back truncation; remove
    one that stopped for good (:mod:`pybk.log.consumers`).
``pybk autorecovery enable|disable|status``, ``listunderreplicated``, ``whoisauditor``,
``triggeraudit``, ``lostbookierecoverydelay [N]``, ``listbookies``, ``clusterinfo``,
``listledgers``, ``ledgermetadata ID``, ``deleteledger ID``, ``bookieinfo``,
``readledger ID [--first N] [--last M] [--bookie ID | --unconfirmed]``
    The admin shell (:mod:`pybk.admin.commands`; the two last ask the bookies:
    :mod:`pybk.admin.inspect`).
``pybk readjournal [FILE|ID]``, ``readlog [LOGID|FILE]``, ``lastmark``,
``localconsistencycheck``
    The offline tools, on a stopped bookie's directories (:mod:`pybk.cli.offline`).
``pybk recover BOOKIE[,BOOKIE...]``, ``pybk decommission BOOKIE``
    Re-replicate stopped bookies' ledgers from here, or retire a stopped bookie through
    autorecovery, with progress on standard error (:mod:`pybk.admin.recover`).
``pybk clean-orphans LOG``
    Delete the ledgers of jobs on a log whose driver died before their commit
    (:func:`pybk.log.commit.clean_orphans`).

``--log-level`` goes before or after the command; ``--version`` prints pybk's version.
The cluster commands live in :mod:`pybk.cli.cluster`; this module only parses.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import fields
from typing import Any, Callable, TypeVar

from pybk import __version__
from pybk.cli import demo
from pybk.errors import InvalidConfiguration
from pybk.settings import ServerSettings

T = TypeVar("T", int, float)

#: ``pybk bookie`` options that name a setting, and the setting.
_BOOKIE_OPTIONS = {"zk": "metadataServiceUri", "listen": "listenAddress",
                   "journal_dir": "journalDirectory", "bookie_id": "bookieId"}
#: What ``--log-level`` takes (in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: The admin shell's commands (:mod:`pybk.admin.commands`,
#: :mod:`pybk.admin.inspect`), with their help; ``autorecovery`` with an action is
#: one too.
ADMIN_COMMANDS = {
    "listunderreplicated": "the under-replicated ledgers: missing replicas, who repairs them",
    "whoisauditor": "the elected auditor",
    "triggeraudit": "make the auditor audit the missing bookies now",
    "lostbookierecoverydelay": "show or set how long a bookie may be gone before its "
                               "ledgers are marked under-replicated",
    "listbookies": "the registered bookies",
    "clusterinfo": "bookies writable, read-only and lost; the auditor; autorecovery; the "
                   "under-replicated backlog; whether one more bookie stopping would lose "
                   "an entry",
    "listledgers": "the ledgers, or those on one bookie",
    "ledgermetadata": "one ledger's metadata",
    "deleteledger": "delete a ledger: its metadata, then its entries on its bookies",
    "bookieinfo": "each registered bookie's state, free and total disk space, as it "
                  "answers itself (unreachable if it does not)",
    "readledger": "a ledger's entries, read through the client without recovery, or "
                  "one bookie's copies of them",
    "recover": "re-replicate the ledgers of stopped bookies from here, or list them "
               "(--query), or say what would be copied (--dry-run)",
    "decommission": "retire a stopped bookie: autorecovery re-replicates its ledgers, "
                    "then its cookie is removed",
}
AUTORECOVERY_ACTIONS = ("enable", "disable", "status")
#: The commands whose ``--zk`` may come from ``--conf`` (``metadataServiceUri``) but
#: not be missing.
_NEEDS_CLUSTER = ("simpletest", "clean-orphans")
#: BookKeeper's name of an admin command where pybk's is shorter.
_BOOKKEEPER_NAMES = {"decommission": "decommissionbookie"}
#: The offline tools' commands (:mod:`pybk.cli.offline`), with their help.
OFFLINE_COMMANDS = {
    "readjournal": "the journal files, or one file's records; says where a torn tail starts",
    "readlog": "the entry logs, or one log's entries",
    "lastmark": "the journal position each ledger directory's LastLogMark holds",
    "localconsistencycheck": "check that every index entry points at a matching, intact "
                             "entry in an entry log",
}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        if args.child:
            demo.write_child(args.dir, args.seconds)
            return 0
        return demo.run_demo(args.dir, args.seconds)
    if args.command == "demote":
        return run_demote(args.dir)
    if args.command == "tail":
        from pybk.cli import wal as tail_command
        return tail_command.run(args.dir, args.start, args.follow, args.poll_ms, args.hex)
    if args.command == "consumers":
        return run_consumers(args, settings_of(parser, args))
    if args.command in OFFLINE_COMMANDS:
        return run_offline(parser, args)
    from pybk.cli import cluster as commands  # ZeroMQ, kazoo: only for the cluster commands
    if args.command in ADMIN_COMMANDS or (args.command == "autorecovery" and args.action):
        return run_admin(parser, args)
    if args.command == "keygen":
        return commands.run_keygen(args.dir, args.name)
    if args.command == "compaction":
        return commands.run_compaction(args.action, args.url, args.major, args.minor,
                                       args.json)
    settings = settings_of(parser, args)
    if args.command == "bookie":
        return commands.run_bookie(settings, args.format, args.lifeline_fd)
    if args.command == "autorecovery":
        return commands.run_autorecovery(settings, args.id or "")
    if args.command == "updatecookie":
        return commands.run_updatecookie(settings)
    if args.command == "format-cluster":
        return commands.run_format_cluster(args.zk, args.layout, settings)
    if args.command == "migrate-logs":
        return commands.run_migrate_logs(
            args.zk, None if args.logs is None else [n for n in args.logs.split(",") if n],
            settings)
    if args.command == "localcluster":
        return commands.run_localcluster(args.bookies, args.dir, settings,
                                         _settings_args(args), args.curve, args.zk_auth)
    if args.command == "simpletest":
        return commands.run_simpletest(settings, args.ensemble, args.write_quorum,
                                       args.ack_quorum, args.entries, args.entry_size)
    if args.command == "clean-orphans":
        return commands.run_clean_orphans(settings, args.log, args.older_than)
    return 2


def run_admin(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """An admin shell command (:mod:`pybk.admin.commands`)."""
    from pybk.admin import commands as admin
    from pybk.admin import inspect as admin_inspect
    try:
        target = admin.target(args.command, settings_of(parser, args), args.json)
    except InvalidConfiguration as e:
        parser.error(str(e))
    if args.command == "autorecovery":
        return admin.run(target, admin.autorecovery(args.action), admin.show_autorecovery)
    if args.command == "deleteledger":
        return admin.run(target, admin.delete_ledger(args.ledger), admin.show_deleted,
                         admin.client)
    if args.command == "readledger":
        return admin.run(target, admin_inspect.read_ledger(
            args.ledger, args.first, args.last, args.bookie, target.password,
            args.unconfirmed),
            admin_inspect.show_ledger_entries, admin.client)
    if args.command == "listledgers":  # streamed: a cluster may hold millions
        return admin.run_streamed(target, admin.list_ledgers(args.meta, args.bookie),
                                  admin.show_ledgers)
    if args.command in ("recover", "decommission"):
        from pybk.admin import recover as recover_commands
        if args.command == "decommission":
            return recover_commands.run_decommission(target, args.bookie, args.timeout)
        return recover_commands.run_recover(
            target, target.settings, args.bookies, query=args.query,
            dry_run=args.dry_run, skip_open=args.skip_open, ledger_id=args.ledger,
            delete_cookie=args.delete_cookie)
    # Each command's work on the store, made from its arguments, and how to show it.
    commands: dict[str, tuple[Callable[[argparse.Namespace], Any], Callable[[Any], list[str]]]]
    commands = {
        "listunderreplicated": (lambda a: admin.list_underreplicated,
                                admin.show_underreplicated),
        "whoisauditor": (lambda a: admin.who_is_auditor, admin.show_auditor),
        "clusterinfo": (lambda a: admin.cluster_info, admin.show_cluster),
        "triggeraudit": (lambda a: admin.trigger_audit, admin.show_trigger),
        "lostbookierecoverydelay": (lambda a: admin.lost_bookie_recovery_delay(a.seconds),
                                    admin.show_delay),
        "listbookies": (lambda a: admin.list_bookies(a.read_only), admin.show_bookies),
        "ledgermetadata": (lambda a: admin.ledger_metadata(a.ledger), admin.show_metadata),
        "bookieinfo": (lambda a: admin_inspect.bookie_info(a.timeout, target.settings),
                       admin_inspect.show_bookie_info),
    }
    work, show = commands[args.command]
    return admin.run(target, work(args), show)


def run_offline(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """An offline tool (:mod:`pybk.cli.offline`)."""
    from pybk.cli import offline as offline
    failed = None
    if args.command == "readjournal":
        work, show = ((offline.journal_records(args.which, args.msg),
                       offline.show_journal_records) if args.which else
                      (offline.journal_listing, offline.show_journal_listing))
    elif args.command == "readlog":
        work, show = ((offline.log_entries(args.which, args.ledger, args.msg),
                       offline.show_log_entries) if args.which else
                      (offline.log_listing, offline.show_log_listing))
    elif args.command == "lastmark":
        work, show = offline.last_mark, offline.show_last_mark
    else:
        work, show, failed = offline.consistency, offline.show_consistency, offline.inconsistent
    if not getattr(args, "which", True) and (args.msg or getattr(args, "ledger", None)):
        parser.error(f"{args.command}: --msg and --ledger apply to one file's records: "
                     "name the file")
    return offline.run(args.command, lambda: bookie_settings(args), work, show, args.json,
                       failed)


def run_demote(directory: str) -> int:
    """``pybk demote DIR``: print what was kept; 1 with the reason if it cannot be done."""
    from pybk.errors import BookKeeperError
    from pybk.log.wal import demote
    try:
        done = demote(directory)
    except BookKeeperError as e:
        print(f"pybk demote: {e}", file=sys.stderr)
        return 1
    print(f"{directory}: demoted from {done.cluster}; it is an embedded WAL again with "
          f"{done.segments_kept} segments ({done.segments_dropped} truncated while "
          "clustered were dropped).  Records written while it was a cluster member are "
          "not in it.")
    return 0


def run_consumers(args: argparse.Namespace, settings: ServerSettings) -> int:
    """``pybk consumers list|remove``: one line per consumer, or say what was removed; 1
    with the reason if the metadata cannot be reached or the consumer is unknown.  A
    cluster is reached with the ZooKeeper credentials of ``settings``."""
    from pybk.errors import BookKeeperError
    from pybk.log import consumers
    from pybk.meta.address import open_metadata_store
    from pybk.meta.zookeeper import ZooKeeperSettings
    where = os.path.join(args.dir, "metadata") if args.dir else settings.metadataServiceUri
    try:
        # A listing leaves a cluster of pybk's former layout as it is
        with open_metadata_store(where, ZooKeeperSettings.of(settings),
                                 move_logs=args.action != "list") as store:
            if args.action == "list":
                for c in consumers.list_consumers(store, args.log):
                    updated = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                            time.gmtime(c.updated_unix_ms / 1000))
                    print(f"{c.consumer_id}\t{c.position}\t{updated}")
                return 0
            missing = [c for c in args.consumer if not consumers.remove(store, args.log, c)]
    except BookKeeperError as e:
        print(f"pybk consumers: {e}", file=sys.stderr)
        return 1
    for consumer_id in args.consumer:
        if consumer_id not in missing:
            print(f"removed consumer {consumer_id} of log {args.log}")
    if missing:
        print(f"pybk consumers: log {args.log} has no consumer {', '.join(missing)}",
              file=sys.stderr)
        return 1
    return 0


def settings_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerSettings:
    """:func:`bookie_settings`, or the usage error that says what is wrong with them
    (exit status 2), also when a command of :data:`_NEEDS_CLUSTER` is given none."""
    try:
        settings = bookie_settings(args)
        if args.command in _NEEDS_CLUSTER and not settings.metadataServiceUri:
            raise InvalidConfiguration("no cluster given: pass --zk zk://host:port/ledgers, "
                                       "or --conf with metadataServiceUri")
    except InvalidConfiguration as e:
        parser.error(str(e))
    return settings


def _settings_args(args: argparse.Namespace) -> list[str]:
    """The ``--conf`` and ``--set`` options given, to pass on to child processes."""
    return ((["--conf", args.conf] if args.conf else [])
            + [arg for assignment in args.set for arg in ("--set", assignment)])


def bookie_settings(args: argparse.Namespace) -> ServerSettings:
    """The settings a command run with ``--conf`` and ``--set`` (:func:`_add_settings`:
    every cluster command and the offline tools) runs with: the ``--conf`` file, then
    ``PYBK_<name>`` variables, then ``--set`` options, then the dedicated options
    (``--zk``, ``--journal-dir``...), later ones winning."""
    known = {f.name for f in fields(ServerSettings)}
    overrides: dict[str, Any] = {}
    for assignment in args.set:
        key, sep, value = assignment.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise InvalidConfiguration(f"--set {assignment!r}: expected KEY=VALUE with a "
                                       "ServerSettings name as KEY")
        overrides[key] = value.strip()
    for option, key in _BOOKIE_OPTIONS.items():
        if getattr(args, option, None) is not None:  # updatecookie has no --listen
            overrides[key] = getattr(args, option)
    if getattr(args, "ledger_dir", None):  # autorecovery has no directories
        overrides["ledgerDirectories"] = ",".join(args.ledger_dir)
    return ServerSettings.load(args.conf, **overrides)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pybk", description="pybk: BookKeeper in Python")
    parser.add_argument("--version", action="version", version=f"pybk {__version__}")
    _add_log_level(parser, "WARNING")
    commands = parser.add_subparsers(dest="command", required=True,
                                     parser_class=_CommandParser)

    demo_cmd = commands.add_parser(
        "demo", help="an embedded WAL: appends, kill -9, restart, verify every record")
    demo_cmd.add_argument("--dir", help="data directory (default: a temporary one)")
    demo_cmd.add_argument("--seconds", type=_positive(float), default=3.0,
                          help="how long the writer appends before it is killed")
    demo_cmd.add_argument("--child", action="store_true", help=argparse.SUPPRESS)

    demote_cmd = commands.add_parser(
        "demote", help="make a promoted WAL directory whose cluster is gone an embedded "
                       "WAL again",
        description="Make a WAL directory promoted to a cluster (pybk.open(DIR, cluster=...)"
                    ") an embedded WAL again, for when that cluster is gone for good.  It "
                    "keeps every record written before the promotion that the cluster "
                    "did not truncate; records written while it was a member are not in "
                    "it.  The cluster is not contacted.")
    demote_cmd.add_argument("dir", metavar="DIR", help="the WAL directory")

    tail = commands.add_parser(
        "tail", help="print a WAL's records, also while its application runs",
        description="Print the records of the WAL in DIR, one a line (position, tab, "
                    "payload as text, or hex), read without disturbing the application "
                    "that has it open (pybk.open_readonly).  With --follow, go on printing "
                    "new ones until interrupted.")
    tail.add_argument("dir", metavar="DIR", help="the WAL directory")
    tail.add_argument("--from", dest="start", metavar="POS",
                      help="start at this position (segment:entry:slot; default: the first "
                           "record)")
    tail.add_argument("--follow", "-f", action="store_true",
                      help="keep printing records as they are appended")
    tail.add_argument("--poll-ms", type=_positive(float), default=10.0, metavar="N",
                      help="with --follow: look for new records at most N ms apart "
                           "(default 10)")
    tail.add_argument("--hex", action="store_true", help="show every payload in hex")

    bookie = commands.add_parser(
        "bookie", help="serve a bookie to a cluster until SIGTERM or SIGINT",
        description="Serve a bookie: check its cookies, register it in ZooKeeper, serve "
                    "over ZeroMQ; SIGTERM or SIGINT unregisters it and closes it gracefully.")
    bookie.add_argument("--zk", metavar="ADDRESS",
                        help="the cluster, zk://host:port[,host:port...]/ledgers "
                             "(setting metadataServiceUri)")
    bookie.add_argument("--listen", metavar="HOST:PORT",
                        help="where to serve; port 0 picks a free one (listenAddress, "
                             "default 127.0.0.1:3181)")
    bookie.add_argument("--journal-dir", help="the journal directory (journalDirectory)")
    bookie.add_argument("--ledger-dir", action="append", default=[],
                        help="a ledger directory; repeat for several (ledgerDirectories)")
    bookie.add_argument("--bookie-id", help="the bookie's id (bookieId; default: host:port)")
    bookie.add_argument("--format", action="store_true",
                        help="format the directories first if they hold no bookie yet")
    _add_settings(bookie)
    bookie.add_argument("--lifeline-fd", type=int, metavar="FD",
                        help="an inherited pipe's read end: stop as on SIGTERM when it "
                             "reads end-of-file, i.e. when the parent holding its write "
                             "end exits (pybk localcluster passes one)")

    recovery = commands.add_parser(
        "autorecovery", help="stand for auditor in a cluster and repair what is marked",
        description="Autorecovery as a process of its own (bookies run it too, with "
                    "autoRecoveryDaemonEnabled): take part in the auditor election and, "
                    "while elected, mark the ledgers of lost bookies under-replicated; "
                    "run a replication worker that re-replicates the marked ledgers "
                    "(unless replicationWorkerEnabled=false). SIGTERM or SIGINT stops it.")
    recovery.add_argument("--zk", metavar="ADDRESS",
                          help="the cluster, zk://host:port[,host:port...]/ledgers "
                               "(metadataServiceUri)")
    recovery.add_argument("--id", help="this process's name in the auditor election "
                                       "(default: <host>-autorecovery-<pid>)")
    _add_settings(recovery)
    recovery.add_argument("action", nargs="?", choices=AUTORECOVERY_ACTIONS,
                          help="instead of running: turn automatic re-replication on "
                               "(enable) or off (disable) cluster-wide, or show which "
                               "(status)")
    recovery.add_argument("--json", action="store_true",
                          help="with an action: answer in JSON")
    _add_admin_commands(commands)
    _add_offline_commands(commands)

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
    _add_settings(update)

    format_cmd = commands.add_parser(
        "format-cluster", help="format a cluster's metadata on ZooKeeper (once)")
    format_cmd.add_argument("--zk", metavar="ADDRESS", required=True,
                            help="zk://host:port[,host:port...]/ledgers")
    format_cmd.add_argument("--layout", choices=("hierarchical", "flat"),
                            default="hierarchical", help="the ledger layout")
    _add_settings(format_cmd)  # zkEnableSecurity: its znodes get ACLs

    migrate_cmd = commands.add_parser(
        "migrate-logs", help="move a cluster's logs from pybk's former ZooKeeper layout "
                             "(beside the root) under its root")
    migrate_cmd.add_argument("--zk", metavar="ADDRESS", required=True,
                             help="zk://host:port[,host:port...]/root")
    migrate_cmd.add_argument("--logs", metavar="NAME,...",
                             help="the logs this cluster takes, comma-separated (empty: "
                                  "none); default: all, if no other cluster of the former "
                                  "layout shares the parent")
    _add_settings(migrate_cmd)

    local = commands.add_parser(
        "localcluster", help="a throwaway ZooKeeper and N bookies on loopback")
    local.add_argument("bookies", type=_positive(int), metavar="N", help="how many bookies")
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
    _add_settings(local, "a bk_server.conf-style key=value settings file for every bookie")

    keygen = commands.add_parser(
        "keygen", help="write a ZeroMQ CURVE key pair for a bookie or a client",
        description="Write NAME.key (the public key: give it to the bookies that should "
                    "accept this process, in their zmqCurveAllowedClientKeysDirectory) and "
                    "NAME.key_secret (the key pair, readable by its owner only: this "
                    "process's zmqCurveSecretKeyFile) into DIR.  Refuses to overwrite.")
    keygen.add_argument("dir", metavar="DIR", help="where the files go (made if missing)")
    keygen.add_argument("name", metavar="NAME", help="the files' name, e.g. bookie1")

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

    consumers = commands.add_parser(
        "consumers", help="list or remove a log's consumers (they hold back truncation)",
        description="A log's consumers (readers that commit how far they read, such as "
                    "Spark queries with the consumerId option) hold back truncation: it "
                    "never passes the slowest one.  List them with their committed "
                    "positions, or remove one that stopped for good.")
    actions = consumers.add_subparsers(dest="action", required=True,
                                       parser_class=_CommandParser)
    for action, text in (("list", "one line per consumer: id, position, last commit"),
                         ("remove", "unregister consumers")):
        sub = actions.add_parser(action, help=text)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--zk", metavar="ADDRESS",
                           help="the cluster, zk://host:port[,host:port...]/ledgers")
        where.add_argument("--dir", help="an embedded WAL directory (not open elsewhere)")
        sub.add_argument("--log", default="wal",
                         help="the log's name (default wal, a WAL directory's log)")
        _add_settings(sub)
        if action == "remove":
            sub.add_argument("consumer", nargs="+", metavar="CONSUMER_ID")

    simple = commands.add_parser(
        "simpletest", help="write a ledger on a cluster and read it back")
    simple.add_argument("--zk", metavar="ADDRESS",
                        help="the cluster, zk://host:port[,host:port...]/ledgers")
    _add_settings(simple)
    count = _positive(int)
    simple.add_argument("--ensemble", type=count, default=3, help="ensemble size E")
    simple.add_argument("--write-quorum", type=count, default=2, help="write quorum Qw")
    simple.add_argument("--ack-quorum", type=count, default=2, help="ack quorum Qa")
    simple.add_argument("--entries", type=count, default=1000, help="how many entries")
    simple.add_argument("--entry-size", type=count, default=1024, help="bytes per entry")

    orphans = commands.add_parser(
        "clean-orphans", help="delete what jobs whose driver died left on a log")
    orphans.add_argument("log", help="the log's name")
    orphans.add_argument("--zk", metavar="ADDRESS",
                         help="the cluster, zk://host:port[,host:port...]/ledgers")
    _add_settings(orphans)
    orphans.add_argument("--older-than", type=_positive(float), default=600.0,
                         metavar="SECONDS", help="give up jobs nothing wrote for this long "
                         "(default 600, the orphanTimeoutSeconds default)")
    return parser


def _add_settings(parser: argparse.ArgumentParser, conf_help: str | None = None) -> None:
    """``--conf`` and ``--set``: how every command that reaches a cluster or a bookie's
    directories takes its settings, read by :func:`bookie_settings`.  The cluster
    commands take the security settings this way (zmqCurveEnabled,
    zmqCurveSecretKeyFile, zkEnableSecurity, zkDigestAuthFile: README "Security")."""
    parser.add_argument("--conf", help=conf_help or (
        "a bk_server.conf-style key=value settings file (metadataServiceUri, zkTimeout, "
        "the credentials: zmqCurveEnabled, zmqCurveSecretKeyFile, zkEnableSecurity, "
        "zkDigestAuthFile, ...)"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any ServerSettings name, e.g. --set zkTimeout=6000 (wins "
                             "over --conf and PYBK_<name> variables)")


def _add_admin_commands(commands: Any) -> None:
    """The admin shell's commands, each with ``--zk``, ``--conf``, ``--set`` and
    ``--json``."""
    for name, text in ADMIN_COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text[0].upper() + text[1:]
                                  + f" (BookKeeper's {_BOOKKEEPER_NAMES.get(name, name)}).")
        sub.add_argument("--zk", metavar="ADDRESS",
                         help="the cluster, zk://host:port[,host:port...]/ledgers")
        _add_settings(sub)
        sub.add_argument("--json", action="store_true",
                         help="one JSON document for scripts instead of a table")
        if name in ("ledgermetadata", "deleteledger", "readledger"):
            sub.add_argument("ledger", type=_whole_number, metavar="ID", help="the ledger's id")
        if name == "readledger":
            sub.add_argument("--first", type=_whole_number, default=0, metavar="N",
                             help="the first entry to show (default 0)")
            sub.add_argument("--last", type=_whole_number, metavar="M",
                             help="the last entry to show (default, and at most: the last "
                                  "entry of a closed ledger, the LAC of an open one)")
            sub.add_argument("--bookie", metavar="ID",
                             help="read only this bookie's copies of the entries its "
                                  "write sets give it, to check one replica")
            sub.add_argument("--unconfirmed", action="store_true",
                             help="read an open ledger past its LAC too, to the last "
                                  "entry its bookies hold (or --last): entries that may "
                                  "not be acknowledged yet")
        elif name == "bookieinfo":
            sub.add_argument("--timeout", type=_positive(float), metavar="SECONDS",
                             default=5.0, help="how long to wait for the bookies' answers, "
                                               "all together (default 5)")
        elif name == "lostbookierecoverydelay":
            sub.add_argument("seconds", type=_whole_number, nargs="?", metavar="N",
                             help="set it to N seconds (default: show it)")
        elif name == "listbookies":
            which = sub.add_mutually_exclusive_group()
            which.add_argument("--rw", dest="read_only", action="store_false", default=None,
                               help="writable bookies only")
            which.add_argument("--ro", dest="read_only", action="store_true",
                               help="read-only bookies only")
        elif name == "recover":
            sub.add_argument("bookies", type=_bookie_list, metavar="BOOKIE[,BOOKIE...]",
                             help="the stopped bookies' ids")
            what = sub.add_mutually_exclusive_group()
            what.add_argument("--query", action="store_true",
                              help="only list the ledgers with a fragment on them")
            what.add_argument("--dry-run", action="store_true",
                              help="only say what would be copied where")
            sub.add_argument("--skip-open", action="store_true",
                             help="leave the ledgers that are not closed as they are "
                                  "(else they are fenced and closed first)")
            sub.add_argument("--ledger", type=_whole_number, metavar="ID",
                             help="recover this ledger only")
            sub.add_argument("--delete-cookie", action="store_true",
                             help="then remove the bookies' cookies from the cluster")
        elif name == "decommission":
            sub.add_argument("bookie", metavar="BOOKIE", help="the stopped bookie's id")
            sub.add_argument("--timeout", type=_positive(float), default=600.0,
                             metavar="SECONDS", help="give up waiting for autorecovery "
                             "after this long (default 600)")
        elif name == "listledgers":
            sub.add_argument("--meta", action="store_true", help="with their metadata")
            sub.add_argument("--bookie", metavar="ID",
                             help="only ledgers with a fragment on this bookie")


def _add_offline_commands(commands: Any) -> None:
    """The offline tools' commands, each with the directory options of ``pybk bookie``
    and ``--json``."""
    for name, text in OFFLINE_COMMANDS.items():
        sub = commands.add_parser(
            name, help=text + " (on a stopped bookie's directories)",
            description=text[0].upper() + text[1:] + ", on a stopped bookie's directories "
            "(BookKeeper's command of that name).  Reads only; refuses directories a "
            "running bookie holds.")
        _add_settings(sub, "a settings file naming the directories (journalDirectory, "
                           "ledgerDirectories)")
        sub.add_argument("--journal-dir", help="the journal directory (journalDirectory)")
        sub.add_argument("--ledger-dir", action="append", default=[],
                         help="a ledger directory; repeat for several, in the bookie's "
                              "order (ledgerDirectories)")
        sub.add_argument("--json", action="store_true",
                         help="one JSON document for scripts instead of a table")
        if name == "readjournal":
            sub.add_argument("which", nargs="?", metavar="FILE|ID",
                             help="a journal file (name or path) or id: show its records")
        elif name == "readlog":
            sub.add_argument("which", nargs="?", metavar="LOGID|FILE",
                             help="an entry log id or file (name or path): show its entries")
            sub.add_argument("--ledger", type=_whole_number, metavar="ID",
                             help="only this ledger's entries")
        if name in ("readjournal", "readlog"):
            sub.add_argument("--msg", action="store_true",
                             help="show payloads (text or hex, cut)")


def _bookie_list(text: str) -> list[str]:
    """An argument type: ``BOOKIE[,BOOKIE...]``."""
    from pybk.admin.recover import parse_bookies
    try:
        return parse_bookies(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _whole_number(text: str) -> int:
    """An argument type: a whole number 0 or over (a ledger id, a number of seconds)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number 0 or over")
    return int(text)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: it takes ``--log-level`` after the command too (a value given
    there wins over one given before it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _add_log_level(self, argparse.SUPPRESS)  # absent: the value before the command


def _add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                        metavar="LEVEL",
                        help=f"what to log: {', '.join(LOG_LEVELS)} (default WARNING)")


def _positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    """An argument type: a ``kind`` number over 0."""
    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not over 0")
        return value

    return parse
