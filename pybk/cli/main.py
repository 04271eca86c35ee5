"""The ``pybk`` command: its parser, built from a module per group of commands.

The demo and the WAL tools (:mod:`pybk.cli.demo`, :mod:`pybk.cli.wal`):

``pybk demo``
    The embedded WAL: appends, kill -9, restart, verify every record (:mod:`pybk.cli.demo`).
``pybk demote DIR``, ``pybk tail DIR [--from POS] [--follow]``, ``pybk consumers list|remove``
    The WAL tools (:mod:`pybk.cli.wal`): turn a promoted WAL directory whose cluster is
    gone back into an embedded WAL; a WAL's records, also while its application has it
    open; a log's consumers and their committed positions, which hold back truncation.

The bookie and cluster commands (:mod:`pybk.cli.cluster`):

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
``pybk compaction status|suspend|resume``
    A running bookie's compactions, through its HTTP admin API.
``pybk simpletest``
    Write a ledger on a cluster, read it back, report the rates.
``pybk clean-orphans LOG``
    Delete the ledgers of jobs on a log whose driver died before their commit
    (:func:`pybk.log.commit.clean_orphans`).

The admin shell (:mod:`pybk.cli.admin`, :mod:`pybk.cli.recover`) and the offline tools
(:mod:`pybk.cli.offline`):

``pybk autorecovery enable|disable|status``, ``listunderreplicated``, ``whoisauditor``,
``triggeraudit``, ``lostbookierecoverydelay [N]``, ``listbookies``, ``clusterinfo``,
``listledgers``, ``ledgermetadata ID``, ``deleteledger ID``, ``bookieinfo``,
``readledger ID [--first N] [--last M] [--bookie ID | --unconfirmed]``
    The admin shell (:mod:`pybk.cli.admin`, over the work of :mod:`pybk.admin`).
``pybk recover BOOKIE[,BOOKIE...]``, ``pybk decommission BOOKIE``
    Re-replicate stopped bookies' ledgers from here, or retire a stopped bookie through
    autorecovery, with progress on standard error (:mod:`pybk.cli.recover`).
``pybk readjournal [FILE|ID]``, ``readlog [LOGID|FILE]``, ``lastmark``,
``localconsistencycheck``
    The offline tools, on a stopped bookie's directories (:mod:`pybk.cli.offline`).

``--log-level`` goes before or after the command; ``--version`` prints pybk's version.
This module only builds the parser from the groups' modules, each of which adds its
commands and runs them (``add_commands``); all answer and fail the same way
(:mod:`pybk.cli.output`) and take their options the same way (:mod:`pybk.cli.options`).
"""

from __future__ import annotations

import argparse
import logging

from pybk import __version__
from pybk.cli import admin, cluster, demo, offline, options, recover, wal
from pybk.cli.output import UsageError

#: The groups of commands, in the order ``pybk --help`` lists them.
GROUPS = (demo, wal, cluster, admin, recover, offline)


def main(argv: list[str] | None = None) -> int:
    """Run ``pybk`` with the arguments ``argv`` (the process's by default); its exit
    status: 0, 1 for a command that failed, 2 for a usage error (from argparse)."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except UsageError as e:
        parser.error(str(e))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pybk", description="pybk: BookKeeper in Python")
    parser.add_argument("--version", action="version", version=f"pybk {__version__}")
    options.add_log_level(parser, "WARNING")
    commands = parser.add_subparsers(dest="command", required=True,
                                     parser_class=options.CommandParser)
    for group in GROUPS:
        group.add_commands(commands)
    return parser
