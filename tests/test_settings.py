"""Settings: BookKeeper's names and defaults, conf files, the environment, validation."""

import os

import pytest

import pybk
from pybk.errors import InvalidConfiguration
from pybk.settings import (
    WAL_SERVER_DEFAULTS,
    ClientSettings,
    LogSettings,
    ServerSettings,
    sort_settings,
)

pytestmark = pytest.mark.timeout(30)


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
    ("replicationRateByBytes", "0"),  # -1 (no limit) or a rate
    ("rereplicationEntryBatchSize", "0"),
    ("rereplicationMaxBytesInFlight", "0"),
    ("openLedgerRereplicationGracePeriod", "-1"),
    ("lockReleaseOfFailedLedgerGracePeriod", "0"),
    ("logSizeLimit", str(1 << 20)),  # under twice maxEntrySizeBytes
    ("zkOperationTimeoutMs", "0"),
    ("zkRetryBackoffStartMs", "5000"),  # above zkRetryBackoffMaxMs
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


@pytest.mark.parametrize("kind,key,value,allowed", [
    (LogSettings, "segmentMaxBytes", "10MB", "an integer (a number of bytes)"),
    (LogSettings, "segmentMaxBytes", 1.5, "an integer (a number of bytes)"),
    (LogSettings, "maxOutstandingBatches", True, "an integer"),
    (LogSettings, "segmentMaxAgeSeconds", "soon", "a number (a number of seconds)"),
    (LogSettings, "digestType", 32, "a string"),
    (ClientSettings, "zmqAddMessagesInFlight", 2.0, "an integer"),
    (ClientSettings, "addEntryTimeout", False, "a number"),
    (ServerSettings, "journalMaxSizeMB", True, "an integer (a number of MiB)"),
    (ServerSettings, "readOnlyModeEnabled", 1, "true or false"),
])
def test_a_value_of_the_wrong_type_is_invalid_configuration_saying_what_is_allowed(
        kind, key, value, allowed):
    """Not a TypeError from a comparison, and no bool or float passing for an integer."""
    message = f"setting {key}={value!r} is invalid: it must be {allowed}"
    with pytest.raises(InvalidConfiguration) as raised:
        kind(**{key: value})
    assert str(raised.value) == message
    if isinstance(value, str):  # a string given by name is parsed, and refused the same way
        with pytest.raises(InvalidConfiguration) as raised:
            kind.from_mapping({key: value})
        assert str(raised.value) == message


def test_strings_given_by_name_are_parsed_for_every_kind_of_settings():
    log_settings = LogSettings.from_mapping({"segmentMaxBytes": " 4096 ",
                                             "segmentMaxAgeSeconds": "1.5"})
    assert (log_settings.segmentMaxBytes, log_settings.segmentMaxAgeSeconds) == (4096, 1.5)
    assert ClientSettings.from_mapping({"addEntryTimeout": "3"}).addEntryTimeout == 3.0


@pytest.mark.parametrize("kind,misspelled,meant", [
    (LogSettings, "segment_max_bytes", "segmentMaxBytes"),
    (LogSettings, "segmentMaxByte", "segmentMaxBytes"),
    (ClientSettings, "addentrytimeout", "addEntryTimeout"),
    (ServerSettings, "journal_max_size_mb", "journalMaxSizeMB"),
])
def test_a_misspelled_name_is_refused_naming_the_setting_meant(kind, misspelled, meant):
    with pytest.raises(InvalidConfiguration,
                       match=f"unknown setting '{misspelled}' \\(did you mean '{meant}'\\?\\)"):
        kind(**{misspelled: 1})
    with pytest.raises(InvalidConfiguration, match=f"did you mean '{meant}'"):
        sort_settings({misspelled: 1}, (ServerSettings, ClientSettings, LogSettings))
    with pytest.raises(InvalidConfiguration, match=f"did you mean '{meant}'"):
        kind().replace(**{misspelled: 1})


def test_a_name_like_no_setting_suggests_nothing():
    with pytest.raises(InvalidConfiguration) as raised:
        sort_settings({"bogus": 1}, (ServerSettings, ClientSettings, LogSettings))
    assert str(raised.value) == ("unknown setting 'bogus': not a setting of ServerSettings, "
                                 "ClientSettings or LogSettings")


def test_a_conf_file_may_hold_unknown_names_and_the_log_says_which_was_meant(tmp_path, caplog):
    conf = tmp_path / "bk_server.conf"
    conf.write_text("journalMaxSizeMb=16\nbookiePort=3181\n")
    assert ServerSettings.load(conf, environ={}).journalMaxSizeMB == 2048  # not applied
    assert "ignoring unknown setting 'journalMaxSizeMb' (did you mean 'journalMaxSizeMB'?)" \
        in caplog.text


def test_raising_the_entry_size_by_name_raises_what_must_fit_it():
    """Settings built by name: maxEntrySizeBytes alone is enough, the entry log and the
    write cache grow to fit it (never shrink), and a setting named explicitly is kept."""
    big = 100 << 20
    s = ServerSettings.load(environ={"PYBK_maxEntrySizeBytes": str(big)})
    assert (s.maxEntrySizeBytes, s.logSizeLimit, s.writeCacheMaxSizeMb) == (big, 1 << 30, 400)
    small = ServerSettings.from_mapping({"maxEntrySizeBytes": 1 << 20})
    assert (small.logSizeLimit, small.writeCacheMaxSizeMb) == (1 << 30, 64)
    wal = ServerSettings.from_mapping({"maxEntrySizeBytes": 10 << 20},
                                      defaults=WAL_SERVER_DEFAULTS)
    assert wal.logSizeLimit == 20 << 20  # from the WAL's 16 MiB
    with pytest.raises(InvalidConfiguration, match="needs logSizeLimit >= 209715200"):
        ServerSettings.from_mapping({"maxEntrySizeBytes": big, "logSizeLimit": big})


def test_the_constructor_names_every_setting_an_entry_size_needs_at_once():
    with pytest.raises(InvalidConfiguration) as raised:
        ServerSettings(maxEntrySizeBytes=100 << 20)
    message = str(raised.value)  # 1 GiB logs hold two 100 MiB entries: only the cache is short
    assert "maxEntrySizeBytes=104857600 needs writeCacheMaxSizeMb >= 400 (it is 64)" in message
    assert "logSizeLimit" not in message
    with pytest.raises(InvalidConfiguration) as raised:
        ServerSettings(maxEntrySizeBytes=600 << 20)
    assert ("needs logSizeLimit >= 1258291200 (it is 1073741824) and writeCacheMaxSizeMb "
            ">= 2400 (it is 64)") in str(raised.value)


def test_logs_replicate_by_default():
    log_settings = LogSettings()
    assert (log_settings.ensembleSize, log_settings.writeQuorumSize,
            log_settings.ackQuorumSize) == (3, 2, 2)  # BookKeeper's client defaults


def test_the_wal_defaults_are_sized_for_an_application():
    wal = ServerSettings.from_mapping({}, defaults=WAL_SERVER_DEFAULTS)
    assert (wal.journalMaxSizeMB, wal.journalMaxBackups, wal.logSizeLimit) == (16, 0, 16 << 20)


def test_a_wal_takes_larger_records_from_record_max_bytes_alone(tmp_path):
    """recordMaxBytes implies the entry size of the client and the bookie, which implies
    the bookie's entry log and write cache sizes."""
    record = os.urandom(20 << 20)
    with pybk.open(tmp_path / "wal", recordMaxBytes=20 << 20) as wal:
        assert wal.bookie.settings.maxEntrySizeBytes > 20 << 20
        assert wal.bookie.settings.logSizeLimit >= 2 * wal.bookie.settings.maxEntrySizeBytes
        position = wal.append(record)
        assert [data for _, data in wal.read(position)] == [record]
    with pytest.raises(InvalidConfiguration,
                       match="unknown setting 'segment_max_bytes' \\(did you mean "
                             "'segmentMaxBytes'\\?\\)"):
        pybk.open(tmp_path / "wal", segment_max_bytes=1 << 20)
    with pytest.raises(InvalidConfiguration, match="segmentMaxBytes='10MB' is invalid"):
        pybk.open(tmp_path / "wal", segmentMaxBytes="10MB")
