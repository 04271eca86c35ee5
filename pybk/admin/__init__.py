"""What an operator asks of a running cluster, shared by the ``pybk`` admin shell and
the HTTP admin API.

:mod:`~pybk.admin.commands` (the registry, ledgers and autorecovery's switches),
:mod:`~pybk.admin.inspect` (what bookies answer themselves), :mod:`~pybk.admin.recover`
(``recover`` and ``decommission``), :mod:`~pybk.admin.simpletest` (write, read and delete
a ledger to check a cluster), with :mod:`~pybk.admin.progress` and
:mod:`~pybk.admin.tables` for their output.

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`,
:mod:`pybk.net`, :mod:`pybk.autorecovery`.
"""
