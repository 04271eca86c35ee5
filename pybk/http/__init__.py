"""A bookie process's HTTP face.

:mod:`~pybk.http.server` is the bounded admin server (a route table, an admin token),
:mod:`~pybk.http.endpoints` BookKeeper's admin endpoints over :mod:`pybk.admin` and the
status page (``status_page.html``), and :mod:`~pybk.http.metrics` the Prometheus metrics
of a bookie, its server and autorecovery, and the endpoint that serves them.

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`,
:mod:`pybk.net`, :mod:`pybk.autorecovery`, :mod:`pybk.admin`.
"""
