"""Consumers of a log (pybk.log.consumers): committed positions kept in the log's
metadata, truncation held back at the slowest, removed with the log, and the ``pybk
consumers`` command.  Real bookies in this process; the command runs against a real
ZooKeeper."""

from __future__ import annotations

import logging

import pytest
import zkutil
from clientutil import Cluster

from pybk import cli
from pybk.errors import MalformedMetadata, MetadataError, NoSuchLog
from pybk.log import LogReader, LogWriter, Position, consumers
from pybk.log.metadata import consumer_path, delete_log, log_path, read_log
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import LogSettings

pytestmark = pytest.mark.timeout(60)

SETTINGS = LogSettings(ensembleSize=2, writeQuorumSize=2, ackQuorumSize=2,
                       segmentMaxBytes=512)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 2)
    yield c
    c.close()


def test_positions_are_set_read_listed_and_removed(cluster):
    store = cluster.client().metadata
    with pytest.raises(NoSuchLog, match="'log'"):
        consumers.set_position(store, "log", "q1", Position(0, 0, 0))
    assert not store.exists(log_path("log"))  # no stray path for a log that is not there
    read_log(store, "log", create=True)
    assert consumers.list_consumers(store, "log") == []
    assert consumers.slowest(store, "log") is None
    consumers.set_position(store, "log", "q1", Position(3, 4, 5))
    consumers.set_position(store, "log", "q2", "1:9:0")
    consumers.set_position(store, "log", "q1", Position(2, 0, 1))  # the last commit wins
    assert consumers.get(store, "log", "q1").position == Position(2, 0, 1)
    assert [(c.consumer_id, c.position) for c in consumers.list_consumers(store, "log")] \
        == [("q1", Position(2, 0, 1)), ("q2", Position(1, 9, 0))]
    assert consumers.slowest(store, "log").consumer_id == "q2"
    assert consumers.remove(store, "log", "q2") is True
    assert consumers.remove(store, "log", "q2") is False
    assert consumers.get(store, "log", "q2") is None
    with pytest.raises(MetadataError, match="not a valid record name"):
        consumers.set_position(store, "log", "a/b", Position(0, 0, 0))
    with pytest.raises(ValueError, match="position"):
        consumers.set_position(store, "log", "q3", "soon")
    store.set(consumer_path("log", "q1"), b"junk", -1)
    with pytest.raises(MalformedMetadata, match="consumer record"):
        consumers.get(store, "log", "q1")


def test_truncation_stops_at_the_slowest_consumer_until_it_moves_or_is_removed(
        cluster, caplog):
    bk = cluster.client()
    with LogWriter.open(bk, "log", SETTINGS) as writer:
        positions = [writer.append(b"%03d" % i + bytes(100)) for i in range(60)]
        assert positions[-1].segment >= 6
        slow, fast, cut = positions[10], positions[40], positions[50]
        consumers.set_position(bk.metadata, "log", "slow", slow)
        consumers.set_position(bk.metadata, "log", "fast", fast)
        with caplog.at_level(logging.INFO, logger="pybk.log.writer"):
            assert writer.truncate(cut) > 0
        assert f"held back from {cut} to {slow}, consumer 'slow'" in caplog.text
        assert read_log(bk.metadata, "log").metadata.truncated_before == slow
        assert [p for p, _ in LogReader(bk, "log").read()][0] == slow  # nothing it needs lost
        consumers.set_position(bk.metadata, "log", "slow", positions[30])
        writer.truncate(cut)
        assert read_log(bk.metadata, "log").metadata.truncated_before == positions[30]
        consumers.remove(bk.metadata, "log", "slow")
        writer.truncate(cut)
        assert read_log(bk.metadata, "log").metadata.truncated_before == fast
        consumers.remove(bk.metadata, "log", "fast")
        writer.truncate(cut)
        assert read_log(bk.metadata, "log").metadata.truncated_before == cut


def test_deleting_a_log_deletes_its_consumers(cluster):
    store = cluster.client().metadata
    read_log(store, "log", create=True)
    consumers.set_position(store, "log", "q", Position(0, 0, 0))
    delete_log(store, "log")
    assert not store.exists(log_path("log"))
    read_log(store, "log", create=True)  # a new log of the same name starts with none
    assert consumers.list_consumers(store, "log") == []


def test_the_consumers_command_lists_and_removes_them(zookeeper, capsys):
    address = zkutil.formatted_cluster(zookeeper)
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        read_log(store, "events", create=True)
        consumers.set_position(store, "events", "etl", Position(4, 2, 0))
        consumers.set_position(store, "events", "audit", Position(1, 0, 7))
        assert cli.main(["consumers", "list", "--zk", address, "--log", "events"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("\t")[:2] for line in lines] == [["audit", "1:0:7"],
                                                            ["etl", "4:2:0"]]
        assert cli.main(["consumers", "remove", "--zk", address, "--log", "events",
                         "audit", "nobody"]) == 1
        captured = capsys.readouterr()
        assert "removed consumer audit of log events" in captured.out
        assert "has no consumer nobody" in captured.err
        assert [c.consumer_id for c in consumers.list_consumers(store, "events")] == ["etl"]
