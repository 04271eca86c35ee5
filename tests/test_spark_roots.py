"""Two clusters on one ZooKeeper through Spark (issue 31 section 8): each writes log ``L``
and reads back its own rows only.

Real Spark (the worker's ``local[2]`` session), a real ZooKeeper and one ``pybk bookie``
process per cluster (E=Qw=Qa=1).
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
import zkutil
from clusterutil import BookieProcesses

from pybk.meta.zookeeper import format_cluster

pytestmark = pytest.mark.timeout(300)

ROWS = 100
ONE_COPY = {"ensembleSize": "1", "writeQuorumSize": "1", "ackQuorumSize": "1"}


def test_two_clusters_with_the_same_parent_each_read_back_their_own_100_rows(
        spark, zookeeper, tmp_path):
    parent = f"/pybk-test-{uuid.uuid4().hex[:12]}"
    with contextlib.ExitStack() as stack:
        addresses = {}
        for name in ("ra", "rb"):
            address = zookeeper.address(f"{parent}/{name}")
            format_cluster(address, settings=zkutil.settings())
            (tmp_path / name).mkdir()
            bookies = BookieProcesses(tmp_path / name, address)
            stack.callback(bookies.close)
            bookies.start_serving(1)
            addresses[name] = address
        for name, address in addresses.items():
            (spark.range(ROWS, numPartitions=2)
             .selectExpr(f"cast(format_string('{name} %03d', id) as binary) as value")
             .write.format("pybk").option("metadataServiceUri", address).option("log", "L")
             .options(**ONE_COPY).mode("append").save())
        for name, address in addresses.items():
            rows = (spark.read.format("pybk").option("metadataServiceUri", address)
                    .option("log", "L").load().collect())
            assert sorted(bytes(row.value) for row in rows) == [
                b"%s %03d" % (name.encode(), i) for i in range(ROWS)]
