"""pybk's cluster layer: what runs between processes.

Today: :mod:`pybk.cluster.zookeeper_server`, throwaway ZooKeeper servers (one, or an
ensemble on loopback) for tests, local clusters and benchmarks.  The ZeroMQ wire
protocol, the bookie server and its registration, placement and autorecovery join here.
"""
