"""The shape of the code base: layers that a newcomer can read in one look, and stay that way.

No import cycles between fleet's modules (lazy and type-only imports count: a cycle is a cycle
to the reader), ``bench/`` does not import ``tests/``, the formatter is never switched off, and a
module over ``MAX_LINES`` lines says here why it is not split.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
#: modules allowed over MAX_LINES, each with the reason it stays one module
LONG: dict[str, str] = {
    "fleet/agent/supervisor.py": "the node supervisor runs as `python -I supervisor.py` (standard library"
    " only, no package on sys.path, and recognised by that argv): a sibling module cannot be imported",
    "fleet/client/sync.py": "Client is the Python API's surface: one short method per API call, each with"
    " the docstring users read; the calls themselves are declared in endpoints.py",
    "fleet/client/aio.py": "AsyncClient is the Python API's async surface: one short method per API call,"
    " as Client's; the calls themselves are declared in endpoints.py",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "fleet").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        # a package's __init__ re-exports its modules: an edge into it is not a layer's edge
        out |= {t for t in targets if t in known and t != name and known[t].name != "__init__.py"}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules in order, the first again at the end), or []."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return []


def test_fleet_has_no_import_cycles() -> None:
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    cycle = _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert sorted(cycle) == ["a", "a", "b", "c"] and cycle[0] == cycle[-1]
    assert _cycle({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []


def test_bench_does_not_import_the_tests() -> None:
    offenders = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert offenders == []


def test_the_services_and_the_cli_start_without_numpy_or_torch() -> None:
    # numpy alone is a third of a second of CPU at every start of an agent, API or controller; only
    # an elastic allocation or a learned profile's fit needs it, and they import it when they run
    code = (
        "import sys\n"
        "import fleet.agent.service, fleet.controller.service, fleet.api.app, fleet.cli.main\n"
        "print(sorted(m for m in ('numpy', 'torch', 'docker') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]"]


def test_each_fleet_worker_module_is_an_attribute_before_anything_imported_it() -> None:
    # a job's launcher that only waits for its workers reads fw.signals.TERMINATED first thing: in a
    # fresh interpreter, where no other name has imported the module yet
    modules = ("checkpoint", "dist", "elastic", "env", "gns", "signals")
    code = f"import fleet_worker as fw\nprint([getattr(fw, m).__name__ for m in {modules!r}], fw.signals.TERMINATED)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = [f"'fleet_worker.{m}'" for m in modules]
    assert done.stdout.strip() == f"[{', '.join(names)}] 143"


def test_the_formatter_is_not_switched_off() -> None:
    """The code is written so that ``ruff format`` lays it out well: no ``# fmt: skip``."""
    marker = "# fmt: " + "skip"
    skipped = [
        f"{path.relative_to(ROOT)}:{number}"
        for top in ("fleet", "tests", "bench", "workers")
        for path in sorted((ROOT / top).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith(marker)
    ]
    assert skipped == []


def test_a_long_module_says_why_it_is_one() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in _modules().values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert {p: n for p, n in long.items() if p not in LONG} == {}
    assert [p for p in LONG if p not in long] == []  # a reason for a module that is short now: drop it
