"""Committed markers kept for a day, and the orphan cleaning that forgets them.

Every batch job's commit now leaves its marker for the orphan cleaning to forget a day
later.  ``clean_orphans`` (``pybk clean-orphans``) goes on while it finds a full CAS of
orphans, but forgets at most ORPHANS_PER_CAS_MAX markers per round: a log that commits
more batch jobs a day than that keeps the rest, whatever cleaning is run.
"""

from __future__ import annotations

import time

import pytest
from test_log_commit import LOG, embedded, job_exists, task_ledger  # noqa: F401 (fixture)

from pybk.log import jobs
from pybk.log.commit import clean_orphans, commit_job
from pybk.log.metadata import ORPHANS_PER_CAS_MAX

pytestmark = pytest.mark.timeout(240)


def test_one_orphan_cleaning_forgets_every_marker_a_day_old(embedded):  # noqa: F811
    bk, _ = embedded.client()
    committed = []
    for i in range(ORPHANS_PER_CAS_MAX + 8):
        job = jobs.begin_job(bk.metadata, LOG)
        ledger = task_ledger(bk, job, 0, [b"r%d" % i])
        assert commit_job(bk, LOG, job, [ledger]).committed
        committed.append(job)
    # A day later (each marker's settling time moved back a day and a minute).
    settled = time.time() - jobs.COMMITTED_MARKER_KEEP_S - 60
    for job in committed:
        marker, version = jobs.read_job(bk.metadata, LOG, job)
        assert marker.committed is not None, "a batch job keeps its marker"
        bk.metadata.set(jobs.job_path(LOG, job), marker._replace(
            committed=marker.committed._replace(settled=settled)).to_bytes(), version)
    assert clean_orphans(bk, LOG, 600.0) == []
    kept = [job for job in committed if job_exists(bk, job)]
    assert kept == [], f"{len(kept)} of {len(committed)} markers a day old are kept after " \
        "an orphan cleaning (it forgets ORPHANS_PER_CAS_MAX a round, and stops after one " \
        "round that gave up no orphan)"
