"""What an operator asks of a running cluster, shared by the ``pybk`` admin shell
(:mod:`pybk.cli.admin` shows the results) and the HTTP admin API: functions of a metadata
store or a ledger client that return plain data (dicts and lists), and print nothing but
the progress of long work.

:mod:`~pybk.admin.commands` (the registry, ledgers and autorecovery's switches),
:mod:`~pybk.admin.inspect` (what bookies answer themselves), :mod:`~pybk.admin.recover`
(``recover`` and ``decommission``, with :mod:`~pybk.admin.progress` on standard error),
:mod:`~pybk.admin.simpletest` (write, read and delete a ledger to check a cluster).

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`,
:mod:`pybk.net`, :mod:`pybk.autorecovery`.
"""
