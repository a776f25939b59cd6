"""pipeline/ is the pure core: no Kafka, HTTP, scheduler or wall-clock reads (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
FORBIDDEN_MODULES = {"kafka", "prometheus_client", "apscheduler", "socket", "http", "urllib", "requests"}
WALL_CLOCK_CALLS = {("time", "time"), ("time", "time_ns"), ("datetime", "now"), ("datetime", "utcnow"),
                    ("date", "today"), ("datetime", "today")}


def _modules() -> list[Path]:
    return sorted(PIPELINE.rglob("*.py"))


def test_the_scan_sees_the_pipeline_modules() -> None:
    names = {str(p.relative_to(PIPELINE).with_suffix("")) for p in _modules()}
    assert {"metrics/kernel", "stream/processor", "offline/baseline", "events/validation"} <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PIPELINE)))
def test_module_imports_no_io_and_reads_no_wall_clock(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            roots = set()
        assert not roots & FORBIDDEN_MODULES, f"{path.name}:{node.lineno} imports {roots & FORBIDDEN_MODULES}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name):
                assert (owner.id, node.func.attr) not in WALL_CLOCK_CALLS, (
                    f"{path.name}:{node.lineno} reads the wall clock ({owner.id}.{node.func.attr}); inject a Clock"
                )
