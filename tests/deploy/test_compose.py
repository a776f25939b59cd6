"""deploy/compose.yaml cannot run here (no docker): check its structure and that everything it mounts or
builds from exists in the repository."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose.yaml"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def test_services() -> None:
    services = _compose()["services"]
    assert set(services) == {"kafka", "baseline", "simulate", "rankwatch", "prometheus", "grafana"}
    assert services["rankwatch"]["command"][:1] == ["run"]
    assert services["simulate"]["command"][:1] == ["simulate"]
    assert "--regression-segment" in services["simulate"]["command"]
    assert services["baseline"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("rankwatch", "simulate"):
        assert services[name]["depends_on"]["baseline"]["condition"] == "service_completed_successfully"
    assert "9108:9108" in services["rankwatch"]["ports"]
    # Exactly one service builds the image the others use.
    assert [n for n, s in services.items() if "build" in s] == ["baseline"]
    assert {s.get("image") for n, s in services.items() if n in ("baseline", "simulate", "rankwatch")} == {
        "rankwatch:local"
    }


def test_the_rankwatch_commands_accept_their_arguments() -> None:
    """Parse the compose command lines with the real click commands (nothing runs)."""
    from rankwatch.commands.offline import command as offline
    from rankwatch.commands.run import command as run
    from rankwatch.commands.simulate import command as simulate

    services = _compose()["services"]
    simulate.make_context("simulate", list(services["simulate"]["command"][1:]))
    script = services["baseline"]["command"][0]
    first, second = (shlex.split(part) for part in script.split("&&"))
    assert first[:2] == ["rankwatch", "simulate"] and second[:2] == ["rankwatch", "offline"]
    simulate.make_context("simulate", first[2:])
    offline.make_context("offline", second[2:])
    run_args = services["rankwatch"]["command"][1:]
    assert run_args[0] == "--config"
    run.make_context("run", [run_args[0], str(DEPLOY / "compose" / "rankwatch.toml")])


def test_the_run_config_is_valid(tmp_path: Path) -> None:
    """The TOML of the rankwatch service loads with rankwatch's own config reader; the baseline directory
    (a volume inside compose) is replaced by a temporary one."""
    from rankwatch.config import config_from_dict

    raw = tomllib.loads((DEPLOY / "compose" / "rankwatch.toml").read_text())
    assert raw["baselines"]["directory"] == "/baselines"
    assert raw["exporter"] == {"host": "0.0.0.0", "port": 9108}
    raw["baselines"]["directory"] = str(tmp_path)
    config = config_from_dict(raw, where="rankwatch.toml")
    assert config.kafka.bootstrap_servers == ("kafka:9092",)


def test_every_mounted_host_path_exists() -> None:
    mounts = [(name, m) for name, s in _compose()["services"].items() for m in _bind_mounts(s)]
    assert len(mounts) >= 6
    for name, (source, _) in mounts:
        assert (DEPLOY / source).resolve().exists(), f"{name}: {source} does not exist"


def test_named_volumes_are_declared() -> None:
    data = _compose()
    declared = set(data.get("volumes", {}))
    for service in data["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, source


def test_builds_use_an_existing_dockerfile_whose_sources_exist() -> None:
    for service in _compose()["services"].values():
        build = service.get("build")
        if not build:
            continue
        context = (DEPLOY / build["context"]).resolve()
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (context / source).exists(), source


def test_prometheus_gets_the_config_rules_and_compose_targets() -> None:
    prometheus = _compose()["services"]["prometheus"]
    targets = dict((t, s) for s, t in _bind_mounts(prometheus))
    assert targets["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"
    assert targets["/etc/prometheus/rules"] == "./prometheus/rules"
    assert targets["/etc/prometheus/targets"] == "./prometheus/targets-compose"
    compose_targets = yaml.safe_load((DEPLOY / "prometheus" / "targets-compose" / "compose.yml").read_text())
    assert compose_targets[0]["targets"] == ["rankwatch:9108"]


def test_grafana_gets_provisioning_and_dashboards() -> None:
    grafana = _compose()["services"]["grafana"]
    targets = dict((t, s) for s, t in _bind_mounts(grafana))
    provisioning = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "rankwatch.yml").read_text())
    assert provisioning["providers"][0]["options"]["path"] in targets
    assert targets["/etc/grafana/provisioning/datasources"] == "../grafana/provisioning/datasources"
    assert any((REPO / "grafana" / "dashboards").glob("*.json"))
