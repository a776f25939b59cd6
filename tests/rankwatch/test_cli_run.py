"""``rankwatch run``: configuration errors are one line naming the key, before any Kafka connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.config import config_from_dict, load_config


def _run(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    rc = main(["run", "--config", str(cfg)])
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[windows]\nattribution = '30x'\n", "windows.attribution: not a duration"),
        ("[windows]\nsizes = ['5m', '300s']\n", "windows.sizes: window sizes must be distinct"),
        ("[kafka]\nbootstrap_servers = [1]\n", "kafka.bootstrap_servers"),
        ("[kafka]\ngroupid = 'x'\n", "kafka.groupid: unknown key"),
        ("[kafka.security]\nsasl_password_typo = 'x'\n", "kafka.security.sasl_password_typo"),
        ("[kafka]\nauto_offset_reset = 'middle'\n", "kafka.auto_offset_reset"),
        ("[kafka]\nmax_poll_records = 0\n", "kafka.max_poll_records: must be >= 1"),
        ("[kafka]\nmax_partition_fetch_bytes = 0\n", "kafka.max_partition_fetch_bytes: must be >= 1"),
        ("[kafka]\nmax_partition_fetch_bytes = '4MiB'\n", "kafka.max_partition_fetch_bytes: expected int"),
        ("[kafka]\ncore_process = 'yes'\n", "kafka.core_process: expected bool"),
        ("[kafka]\ntimestamps = 'send'\n", "kafka.timestamps: must be 'record' or 'event'"),
        ("[kafka]\novertake_grace = '-1s'\n", "kafka.overtake_grace: not a duration"),
        ("[topics]\nimpressions = 'x'\nclicks = 'x'\n", "topics.clicks: must differ"),
        ("[slices]\nby = ['colour']\n", "slices.by: cannot slice by 'colour'"),
        ("[metrics]\ngain = 'cubic'\n", "metrics.gain"),
        ("[exporter]\nport = 70000\n", "exporter.port: not a TCP port"),
        ("[exporter]\ntls_certfile = 'nope.pem'\n", "exporter.tls_certfile: no such file"),
        ("[exporter]\nbasic_auth_user = 'prom'\n", "exporter.basic_auth_password_file: basic auth needs both"),
        ("[baselines]\nreload_interval = 'soon'\n", "baselines.reload_interval: not a duration"),
        ("[actions]\nclick = -1\n", "actions.click"),
        ("[limits]\nmax_pending_requests = true\n", "limits.max_pending_requests: expected int"),
        ("[nonsense]\n", "unknown table [nonsense]"),
        ("not toml = = =\n", "not valid TOML"),
    ],
)
def test_bad_config_fails_with_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       text: str, needle: str) -> None:
    rc, err = _run(tmp_path, text, capsys)
    assert rc != 0
    assert err.count("\n") == 1 and err.startswith("rankwatch: error: "), err
    assert needle in err


def test_missing_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(tmp_path / "nope.toml")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such config file" in err


def test_example_config_loads_and_passes_security_settings_through() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "rankwatch.toml"
    cfg = load_config(example)
    assert cfg.kafka.impressions_topic == "impressions" and cfg.stream.windows == ("5m", "1h")
    secure = config_from_dict({"kafka": {"security": {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                                      "sasl_plain_username": "u", "sasl_plain_password": "p"}}})
    kwargs = secure.kafka.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_plain_password"] == "p"


def test_kafka_timestamps_default_to_event_time() -> None:
    assert config_from_dict({}).kafka.timestamps == "event"
    assert config_from_dict({"kafka": {"timestamps": "record"}}).kafka.timestamps == "record"


def test_partition_fetches_default_to_four_mebibytes_and_can_be_set() -> None:
    assert config_from_dict({}).kafka.max_partition_fetch_bytes == 4 * 1024 * 1024
    assert config_from_dict({"kafka": {"max_partition_fetch_bytes": 1_048_576}}).kafka.max_partition_fetch_bytes == 1_048_576


def test_overtake_grace_defaults_to_a_quarter_second_and_can_be_switched_off() -> None:
    assert config_from_dict({}).kafka.overtake_grace_s == 0.25
    assert config_from_dict({"kafka": {"overtake_grace": "0s"}}).kafka.overtake_grace_s == 0
    assert config_from_dict({"kafka": {"overtake_grace": "2s"}}).kafka.overtake_grace_s == 2


def test_defaults_match_the_spec() -> None:
    cfg = config_from_dict({})
    assert cfg.stream.windows == ("5m", "1h") and cfg.stream.attribution_window_ms == 30 * 60_000
    assert cfg.kafka.group_id == "rankwatch" and cfg.kafka.checkpoints == "rankwatch.checkpoints"
    assert cfg.kafka.dead_letters == "rankwatch.dead-letters"
    assert (cfg.exporter.host, cfg.exporter.port) == ("127.0.0.1", 9108)
    assert cfg.kafka.core_process  # the streaming core in a second process unless told otherwise
    assert not config_from_dict({"kafka": {"core_process": False}}).kafka.core_process


def test_exporter_tls_and_basic_auth_settings_resolve_relative_to_the_config(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem", "password"):
        (tmp_path / name).write_text("x\n")
    cfg = config_from_dict(
        {
            "exporter": {"tls_certfile": "cert.pem", "tls_keyfile": "key.pem", "basic_auth_user": "prom",
                         "basic_auth_password_file": "password"},
            "baselines": {"reload_interval": "30s"},
        },
        base=tmp_path,
    )
    assert cfg.exporter.tls_certfile == tmp_path / "cert.pem" and cfg.exporter.tls_keyfile == tmp_path / "key.pem"
    assert cfg.exporter.basic_auth_user == "prom"
    assert cfg.exporter.basic_auth_password_file == tmp_path / "password"
    assert cfg.baseline_reload_ms == 30_000
    half = {"exporter": {"tls_certfile": "cert.pem"}}
    with pytest.raises(Exception, match="exporter.tls_keyfile: TLS needs both"):
        config_from_dict(half, base=tmp_path)


EXAMPLE_EVAL = Path(__file__).resolve().parents[2] / "examples" / "eval.csv"


def _baseline(tmp_path: Path, name: str, *options: str) -> Path:
    out = tmp_path / name
    assert main(["offline", str(EXAMPLE_EVAL), "--output", str(out), *options]) == 0
    return out


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (("--gain", "linear"), "gain is 'linear' in the baseline, 'exponential' in the service"),
        (("--ndcg-k", "3"), "ndcg_cutoffs is [3] in the baseline, [5, 10] in the service"),
        (("--map-norm", "min-relevant-k"), "map_normalization is 'min_relevant_k' in the baseline"),
        (("--by", "segment"), "slice_by is ['segment'] in the baseline, ['segment', 'surface'] in the service"),
    ],
)
def test_a_baseline_with_other_metric_options_stops_run_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: tuple[str, ...], needle: str
) -> None:
    path = _baseline(tmp_path, "other.json", *options)
    capsys.readouterr()
    rc, err = _run(tmp_path, f"[baselines]\nfiles = ['{path.name}']\n", capsys)
    assert rc != 0
    assert err.count("\n") == 1 and err.startswith("rankwatch: error: baselines: "), err
    assert "other.json: computed with other metric options" in err and needle in err, err


def test_a_missing_or_corrupt_baseline_at_start_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(tmp_path, "[baselines]\nfiles = ['gone.json']\n", capsys)
    assert rc != 0 and err.count("\n") == 1 and "baselines.files: no such file" in err and "gone.json" in err, err
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "half.json").write_text('{"format": "rankwatch-baseline/1", "result": {')
    for text in ("[baselines]\nfiles = ['dir/half.json']\n", "[baselines]\ndirectory = 'dir'\n"):
        rc, err = _run(tmp_path, text, capsys)
        assert rc != 0 and err.count("\n") == 1, err
        assert err.startswith("rankwatch: error: baselines: ") and "half.json: not a baseline file" in err, err
