"""``[[experiments]]`` in the run configuration: defaults, checks and one-line errors naming the key."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rankwatch.config import load_config
from rankwatch.errors import ConfigError
from rankwatch.pipeline.experiments.spec import ExperimentSpec, experiment_from_dict


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rankwatch.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_experiments_table_with_defaults_and_options(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, """
[kafka]
bootstrap_servers = ["127.0.0.1:9092"]

[[experiments]]
name = "ranker-v13"

[[experiments]]
name = "boost"
label = "model"
control = "v12"
treatments = ["v13", "v14"]
split = { v12 = 2, v13 = 1, v14 = 1 }
start = 2026-11-30T10:00:00Z
unit = "user"
alpha = 0.01
min_requests = 500
decision = "fixed"
"""))
    first, second = cfg.experiments
    assert first == ExperimentSpec(name="ranker-v13")
    assert first.shares == {"control": 0.5, "treatment": 0.5} and first.tuning == 50_000
    assert second.label == "model" and second.arms == ("v12", "v13", "v14")
    assert second.shares == {"v12": 0.5, "v13": 0.25, "v14": 0.25}
    assert second.start == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert second.unit == "user" and second.tuning == 5_000 and second.alpha == 0.01
    assert second.decision == "fixed" and second.min_requests == 500


def test_no_experiments_is_fine(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "[kafka]\n")).experiments == ()


@pytest.mark.parametrize(("body", "message"), [
    ('name = "x"\nunit = "session"', "experiments[0].unit: must be 'request' or 'user'"),
    ('name = "x"\nalpha = 1.5', "experiments[0].alpha: must be between 0 and 1"),
    ('name = "x"\ncolour = "red"', "experiments[0].colour: unknown key"),
    ('label = "variant"', "experiments[0].name: missing"),
    ('name = "x"\ntreatments = ["control"]', "experiments[0].treatments: arms must be distinct"),
    ('name = "x"\nsplit = { control = 1 }', "experiments[0].split: needs a share for each arm"),
    ('name = "x"\nstart = "yesterday"', "experiments[0].start: not an RFC 3339 time"),
    ('name = "x"\nstart = 2026-11-30T10:00:00', "experiments[0].start: needs a time zone"),
    ('name = "x"\nlabel = "segment"', "experiments[0].label: must be one of variant, model"),
    ('name = "x"\nmin_requests = "many"', "experiments[0].min_requests: expected int"),
])  # fmt: skip
def test_bad_experiment_is_one_line_naming_the_key(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, f"[[experiments]]\n{body}\n"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_duplicate_names_and_wrong_shape_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names must be unique"):
        load_config(_write(tmp_path, '[[experiments]]\nname = "a"\n[[experiments]]\nname = "a"\n'))
    with pytest.raises(ConfigError, match="expected an array of tables"):
        load_config(_write(tmp_path, '[experiments]\nname = "a"\n'))


def test_integer_alpha_is_a_number_and_bools_are_not() -> None:
    with pytest.raises(ValueError, match="alpha"):
        experiment_from_dict({"name": "x", "alpha": True})
    with pytest.raises(ValueError, match="alpha: must be between"):
        experiment_from_dict({"name": "x", "alpha": 1})
