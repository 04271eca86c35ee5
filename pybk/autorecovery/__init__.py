"""Autorecovery: lost bookies' ledgers found and copied back to full replication.

:mod:`~pybk.autorecovery.service` runs in every bookie process (and in ``pybk
autorecovery``): the auditor election (:mod:`~pybk.autorecovery.election`) and, while
elected, the auditor (:mod:`~pybk.autorecovery.auditor`, with
:mod:`~pybk.autorecovery.replicas` and :mod:`~pybk.autorecovery.ledger_check`), which
marks the ledgers of lost bookies in the under-replication metadata
(:mod:`pybk.meta.underreplication`); and a replication worker
(:mod:`~pybk.autorecovery.worker`) that claims marked ledgers and copies their missing
fragments (:mod:`~pybk.autorecovery.rereplication`, at a rate kept by
:mod:`~pybk.autorecovery.throttle`).

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`,
:mod:`pybk.net`.
"""
