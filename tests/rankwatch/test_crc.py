"""kafka-python verifies record CRCs with the crc32c C extension in the installed environment."""

from __future__ import annotations

import logging

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from rankwatch.crc import bound_crc32c, crc32c_is_c, log_crc32c


def test_kafka_python_binds_the_c_function() -> None:
    fn = bound_crc32c()
    assert fn is crc32c.crc32c
    assert type(fn).__name__ == "builtin_function_or_method"  # C, not a Python function
    assert crc32c_is_c()
    assert fn(b"123456789") == 0xE3069283  # the CRC-32C check value


def _batch() -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(5):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b'{"n":%d}' % i, headers=[])
    return builder.build()


def test_a_real_batch_validates_and_one_flipped_byte_fails() -> None:
    buf = _batch()
    assert DefaultRecordBatch(bytes(buf)).validate_crc()
    bad = bytearray(buf)
    bad[-3] ^= 0x01  # inside the last record's value, covered by the CRC
    assert not DefaultRecordBatch(bytes(bad)).validate_crc()


def test_start_up_line_names_the_c_path(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rankwatch"):
        assert log_crc32c(logging.getLogger("rankwatch"))
    assert any(r.levelno == logging.INFO and "crc32c C extension" in r.message for r in caplog.records)


def test_start_up_line_warns_for_pure_python(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kafka.record import util

    monkeypatch.setattr(util.calc_crc32c, "__defaults__", (util.crc32c_py,))
    with caplog.at_level(logging.INFO, logger="rankwatch"):
        assert not log_crc32c(logging.getLogger("rankwatch"))
    assert any(r.levelno == logging.WARNING and "install crc32c" in r.message for r in caplog.records)
