"""Settings: BookKeeper's names and defaults, conf files, the environment, validation."""

import pytest

from pybk.errors import InvalidConfiguration
from pybk.settings import ClientSettings, ServerSettings


def test_defaults_are_bookkeepers():
    s = ServerSettings()
    assert s.journalMaxGroupWaitMSec == 2
    assert s.journalBufferedWritesThreshold == 512 * 1024
    assert s.journalMaxBackups == 5
    assert s.minorCompactionThreshold == 0.2
    assert s.minorCompactionInterval == 3600
    assert s.majorCompactionThreshold == 0.8
    assert s.majorCompactionInterval == 86400
    assert s.diskUsageThreshold == 0.95
    assert s.readOnlyModeEnabled is True


def test_conf_file_then_environment_then_overrides(tmp_path):
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "# a comment\n"
        "journalDirectory=/data/journal\n"
        "ledgerDirectories=/data/l1, /data/l2\n"
        "journalMaxGroupWaitMSec=5\n"
        "readOnlyModeEnabled=false\n"
        "bookiePort=3181\n"  # a key of a part pybk does not have: ignored
    )
    env = {"PYBK_journalMaxGroupWaitMSec": "7", "PYBK_flushInterval": "1234"}
    s = ServerSettings.load(conf, environ=env, gcWaitTime=99)
    assert s.journalDirectory == "/data/journal"
    assert s.ledgerDirectories == ("/data/l1", "/data/l2")
    assert s.journalMaxGroupWaitMSec == 7.0
    assert s.flushInterval == 1234
    assert s.readOnlyModeEnabled is False
    assert s.gcWaitTime == 99


@pytest.mark.parametrize("key,value", [
    ("journalMaxBackups", "-1"),
    ("journalMaxSizeMB", "0"),
    ("flushInterval", "soon"),
    ("diskUsageThreshold", "1.5"),
    ("minorCompactionThreshold", "0.9"),  # above the major threshold
    ("readOnlyModeEnabled", "maybe"),
    ("maxEntrySizeBytes", str(2 * 1024 ** 3)),  # larger than the entry log size limit
])
def test_invalid_value_names_the_key(key, value):
    with pytest.raises(InvalidConfiguration, match=key):
        ServerSettings.load(environ={}, **{key: value})


def test_environment_value_is_validated():
    with pytest.raises(InvalidConfiguration, match="journalQueueSize"):
        ServerSettings.load(environ={"PYBK_journalQueueSize": "-3"})


def test_unreadable_conf_file_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidConfiguration, match="cannot read settings file"):
        ServerSettings.load(tmp_path / "missing.conf", environ={})


def test_malformed_conf_line_names_file_and_line(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("journalDirectory=/x\nthis line has no equals sign\n")
    with pytest.raises(InvalidConfiguration, match="bad.conf:2"):
        ServerSettings.load(conf, environ={})


@pytest.mark.parametrize("key,value", [
    ("maxEntrySizeBytes", 0),
    ("zmqHeartbeatIntervalMs", 0),
    ("zmqHeartbeatTimeoutMs", 500),  # not longer than the interval
    ("zmqReconnectIntervalMaxMs", -1),
])
def test_invalid_client_setting_names_the_key(key, value):
    with pytest.raises(InvalidConfiguration, match=key):
        ClientSettings(**{key: value})


def test_in_progress_limits_are_bounded():
    with pytest.raises(InvalidConfiguration, match="maxAddsInProgressLimit"):
        ServerSettings(maxAddsInProgressLimit=0)
