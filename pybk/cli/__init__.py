"""The ``pybk`` command: one parser (:mod:`~pybk.cli.main`) built from a module per group
of commands, each adding its commands and running them: bookies and clusters
(:mod:`~pybk.cli.cluster`), the admin shell (:mod:`~pybk.cli.admin`; its work is
:mod:`pybk.admin`'s), recovery (:mod:`~pybk.cli.recover`), offline tools on a stopped
bookie's directories (:mod:`~pybk.cli.offline`), WAL tools (:mod:`~pybk.cli.wal`) and the
demo ``make run`` runs (:mod:`~pybk.cli.demo`).  All take their options the same way
(:mod:`~pybk.cli.options`) and answer the same way (:mod:`~pybk.cli.output`: tables or
one JSON document on standard output, a failure as one line on standard error).

May import: every other package of pybk; only ``python -m pybk`` (:mod:`pybk.__main__`)
imports it.
"""

from pybk.cli.main import main

__all__ = ["main"]
