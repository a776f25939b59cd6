"""One installed import namespace, and import arrows that point down.

The repository keeps the design card's top-level folders (``pipeline/``, ``consumers/``, ``exporters/``);
``rankwatch/pipeline`` etc. are relative symlinks to them, so the installed distribution, an editable
install and a plain checkout all import the same names: ``rankwatch.pipeline``, ``rankwatch.consumers``,
``rankwatch.exporters``. Names such as ``pipeline`` or ``exporters`` are other distributions on PyPI, and a
user's own ``pipeline.py`` must never shadow rankwatch's code.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("pipeline", "consumers", "exporters")
# Which layer may import which: the core imports only itself; Kafka and exporter layers import the core;
# the application layer (rankwatch/*.py, rankwatch/commands) imports everything.
ALLOWED = {
    "pipeline": {"pipeline"},
    "consumers": {"pipeline", "consumers"},
    "exporters": {"pipeline", "exporters"},
    "app": {"pipeline", "consumers", "exporters", "app"},
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (found,) = out.glob("rankwatch-*.whl")
    return found


def test_the_wheel_has_one_top_level_import_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"rankwatch"}
    for layer in LAYERS:
        assert f"rankwatch/{layer}/__init__.py" in names
    assert "rankwatch/pipeline/metrics/kernel.py" in names and "rankwatch/consumers/service.py" in names
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level is not None:
        with zipfile.ZipFile(wheel) as zf:
            assert zf.read(top_level).decode().split() == ["rankwatch"]


def test_a_users_own_pipeline_exporters_and_consumers_do_not_shadow_rankwatch(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    user = tmp_path / "notebook"
    user.mkdir()
    (user / "pipeline.py").write_text("raise ImportError('the user pipeline.py was imported')\n")
    for name in ("exporters", "consumers"):
        (user / name).mkdir()
        (user / name / "__init__.py").write_text(f"raise ImportError('the user {name}/ was imported')\n")
    (user / "eval.csv").write_text(
        "request_id,item_id,position,score,label,segment,surface\n"
        "r1,a,1,0.9,1,new,home\nr1,b,2,0.5,0,new,home\nr2,c,1,0.8,0,new,home\nr2,d,2,0.7,2,new,home\n"
    )
    code = (
        "import sys; sys.argv = ['rankwatch', 'offline', 'eval.csv', '--format', 'json'];"
        "import rankwatch.consumers.service, rankwatch.exporters.http;"
        "from rankwatch.cli import entry; entry()"
    )
    # The checkout must not be importable here: only the installed copy in `site` is on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-c", code], cwd=user, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"overall"' in done.stdout
    where = subprocess.run([sys.executable, "-c", "import rankwatch.pipeline as p; print(p.__file__)"], cwd=user,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(site))


def _layer_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0] if rel[0] in LAYERS else "app"


def _imported_layers(tree: ast.AST) -> list[tuple[int, str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] in LAYERS:
                found.append((node.lineno, module, "bare"))
            elif parts[0] == "rankwatch":
                layer = parts[1] if len(parts) > 1 and parts[1] in LAYERS else "app"
                found.append((node.lineno, module, layer))
    return found


def _package_modules() -> list[Path]:
    paths = [p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")]
    paths += [p for p in (ROOT / "rankwatch").rglob("*.py") if not any(part in LAYERS for part in p.relative_to(ROOT).parts[1:2])]
    return sorted(paths)


def test_no_module_imports_a_bare_layer_name_and_every_arrow_points_down() -> None:
    modules = _package_modules()
    assert len(modules) > 40
    problems = []
    for path in modules:
        layer = _layer_of(path)
        for lineno, module, target in _imported_layers(ast.parse(path.read_text(encoding="utf-8"))):
            if target == "bare":
                problems.append(f"{path.relative_to(ROOT)}:{lineno} imports bare {module}")
            elif target not in ALLOWED[layer]:
                problems.append(f"{path.relative_to(ROOT)}:{lineno} ({layer}) imports {module} ({target})")
    assert not problems, "\n".join(problems)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in LAYERS:
        parts = ["rankwatch", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    # Module-level imports and TYPE_CHECKING imports alike: a circle is a design smell either way.
    graph: dict[str, set[str]] = {}
    names = {_module_name(p): p for p in _package_modules()}
    for name, path in names.items():
        deps = set()
        for _, module, _ in _imported_layers(ast.parse(path.read_text(encoding="utf-8"))):
            while module and module not in names:
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):
                deps.add(module)
        graph[name] = deps
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for dep in graph.get(node, ()):
            if seen.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in seen:
                visit(dep)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)


def test_python_dash_m_rankwatch_runs_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rankwatch", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "offline" in done.stdout


# -- rooms of the core ---------------------------------------------------------------------------------
# The core is organised in packages by concept (docs/architecture.md). A room is a sub-package of
# pipeline/ or a module loose at its top; the arrows between rooms must point down, with no circle.
MAX_MODULES_PER_ROOM = 20
MAX_LOOSE_MODULES = 6
MAX_MODULE_LINES = 600


def _room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["rankwatch", "pipeline"] or len(parts) < 3:
        return None
    return parts[2]


def _pipeline_room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "pipeline").rglob("*.py"):
        name = _module_name(path)
        room = _room_of(name)
        if room is None:
            continue
        deps = graph.setdefault(room, set())
        for _, module, _ in _imported_layers(ast.parse(path.read_text(encoding="utf-8"))):
            target = _room_of(module)
            if target is not None and target != room:
                deps.add(target)
    return graph


def test_the_core_is_rooms_of_one_concept_each() -> None:
    pipeline = ROOT / "pipeline"
    packages = sorted(p for p in pipeline.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    loose = sorted(p.stem for p in pipeline.glob("*.py") if p.stem != "__init__")
    assert len(packages) >= 4, packages
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    for package in packages:
        modules = [p for p in package.rglob("*.py") if p.stem != "__init__"]
        assert len(modules) <= MAX_MODULES_PER_ROOM, f"{package.name}: {len(modules)} modules"
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        assert doc, f"pipeline/{package.name}/__init__.py must say what the room is and offers"


def test_no_circle_between_the_rooms_of_the_core() -> None:
    graph = _pipeline_room_graph()
    assert {"metrics", "events", "stream", "offline", "experiments"} <= set(graph)
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> None:
        if state.get(room) == 1:
            raise AssertionError("circle between rooms: " + " -> ".join(path[path.index(room):] + [room]))
        if state.get(room) == 2:
            return
        state[room] = 1
        for dep in sorted(graph.get(room, ())):
            visit(dep, path + [room])
        state[room] = 2
        order.append(room)

    for room in sorted(graph):
        visit(room, [])
    # The kernel's room stands on nothing but loose modules: online and offline share it.
    assert graph["metrics"] <= {"slicing", "clock", "errors"}, graph["metrics"]


def test_no_module_of_the_three_layers_is_over_the_size_limit() -> None:
    big = []
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_MODULE_LINES:
                big.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not big, big
