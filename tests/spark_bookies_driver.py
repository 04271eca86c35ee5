"""A Spark driver hosting executor bookies, for tests that kill it: it starts a
SparkSession on MASTER, runs ``executor_bookies`` with COUNT holders (bookies listen on
loopback; their directories under LOCAL_DIR, Spark's local directory), prints one JSON
line listing the bookies, and sleeps until it is killed.  ``KEY=VALUE`` arguments are
the ``settings`` of ``executor_bookies`` (a secured cluster's credentials).

Usage: python spark_bookies_driver.py ADDRESS MASTER COUNT LOCAL_DIR [KEY=VALUE...]
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import sparkutil

from pybk.spark.bookies import executor_bookies


def main(address: str, master: str, count: int, local_dir: str,
         settings: dict[str, str]) -> None:
    with sparkutil.spark_session(master, **{"spark.local.dir": local_dir}) as spark, \
            executor_bookies(spark, address, count=count,
                             session_timeout_ms=2_000, settings=settings) as hosted:
        print(json.dumps([dataclasses.asdict(b) for b in hosted.bookies]), flush=True)
        time.sleep(600)  # until killed; a test that forgets to kill it still ends


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4],
         dict(arg.split("=", 1) for arg in sys.argv[5:]))
