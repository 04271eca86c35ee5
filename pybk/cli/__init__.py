"""The ``pybk`` command: one parser (:mod:`~pybk.cli.main`) and a module per group of
commands: bookies and clusters (:mod:`~pybk.cli.cluster`), offline tools on a stopped
bookie's directories (:mod:`~pybk.cli.offline`), WAL tools (:mod:`~pybk.cli.wal`) and
the demo ``make run`` runs (:mod:`~pybk.cli.demo`); the admin shell's work is in
:mod:`pybk.admin`.

May import: every other package of pybk; nothing imports it.
"""

from pybk.cli.main import main

__all__ = ["main"]
