"""The package's floors (docs/architecture.md), read from the code: who imports whom, file sizes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PLAN_ORDER = ["arithmetic", "schedule", "hardware", "inputs", "tokens", "make", "render", "cli"]


def is_module(name: str) -> bool:
    path = SRC / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def llmpipe_imports(path: Path) -> set[str]:
    """llmpipe modules a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmpipe"):
            for a in node.names:  # `from package import module` depends on that module, else on the package's names
                sub = f"{node.module}.{a.name}"
                found.add(sub if is_module(sub) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("llmpipe"))
    return found


def module_graph(package: str) -> dict[str, set[str]]:
    """{module: modules of `package` it imports}, for every module under src/<package>."""
    folder = SRC / package.replace(".", "/")
    mods = {}
    for path in folder.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {m: {t for t in llmpipe_imports(p) if t in mods and t != m} for m, p in mods.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, or None."""
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v) :] + [u, v] if v in path else [u, v]
            if not state.get(v) and (found := visit(v, path + [u])):
                return found
        state[u] = 2
        return None

    for m in sorted(graph):
        if not state.get(m) and (found := visit(m, [])):
            return found
    return None


def test_data_and_plan_imports_flow_one_way():
    """No import circle inside llmpipe.data or llmpipe.plan, counting imports inside functions."""
    for package in ("llmpipe.data", "llmpipe.plan"):
        assert cycle(module_graph(package)) is None, f"{package}: import circle {' -> '.join(cycle(module_graph(package)))}"


def test_cycle_finder_sees_a_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_plan_modules_import_only_those_before_them():
    plan = SRC / "llmpipe" / "plan"
    assert sorted(p.stem for p in plan.glob("*.py") if p.stem != "__init__") == sorted(PLAN_ORDER)
    for i, name in enumerate(PLAN_ORDER):
        inside = {m.split(".")[2] for m in llmpipe_imports(plan / f"{name}.py") if m.startswith("llmpipe.plan.")}
        later = inside & set(PLAN_ORDER[i:])
        assert not later, f"llmpipe.plan.{name} imports {sorted(later)}: a module at or after its own floor"


def test_plan_arithmetic_has_no_io_and_loads_alone():
    tree = ast.parse((SRC / "llmpipe" / "plan" / "arithmetic.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "dataclasses"}, imported
    code = "import sys, llmpipe.plan.arithmetic; print(sorted(m for m in sys.modules if m.startswith('llmpipe')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["llmpipe", "llmpipe.plan", "llmpipe.plan.arithmetic"])


def test_no_source_file_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these by concern (docs/architecture.md): {long}"
