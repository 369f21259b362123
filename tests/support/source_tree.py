"""A source tree as the architecture checks read it: for each module, the names it imports
(lazy imports inside functions too), its line count, its string constants, its threads and
sleeping loops, where it reads the process environment, and the imported names it calls. Nothing is imported: the
source is parsed."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ENV_READS = frozenset({"environ", "environb", "getenv", "getenvb"})


@dataclass
class Tree:
    imports: dict[str, set[str]] = field(default_factory=dict)  # module -> imported names
    lines: dict[str, int] = field(default_factory=dict)
    literals: dict[str, set[str]] = field(default_factory=dict)  # module -> its string constants
    loops: dict[str, list[str]] = field(default_factory=dict)  # module -> its threads and sleeping loops
    env_reads: dict[str, list[str]] = field(default_factory=dict)  # module -> where it reads os.environ
    calls: dict[str, set[str]] = field(default_factory=dict)  # module -> the imported names it calls


def read_tree(root: Path, packages: tuple[str, ...]) -> Tree:
    """Every module under the named top-level folders of ``root`` (migrations left out)."""
    tree = Tree()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_pkg else parts)
            source = path.read_text()
            tree.lines[module] = source.count("\n")
            parsed = ast.parse(source)
            tree.imports[module] = _imports(parsed, module, is_pkg)
            tree.literals[module] = {
                n.value for n in ast.walk(parsed) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            tree.loops[module] = _loops(parsed)
            tree.env_reads[module] = _env_reads(parsed)
            tree.calls[module] = _calls(parsed, module, is_pkg)
    return tree


def _env_reads(node: ast.AST) -> list[str]:
    """Where a module reads the process environment: ``os.environ`` / ``os.getenv`` (``os``
    under any name), or ``environ`` / ``getenv`` imported from ``os``."""
    os_names = {
        a.asname or a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names if a.name == "os"
    }
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ENV_READS and getattr(n.value, "id", None) in os_names:
            out.append(f"line {n.lineno}: os.{n.attr}")
        elif isinstance(n, ast.ImportFrom) and n.module == "os" and not n.level:
            out.extend(f"line {n.lineno}: os.{a.name}" for a in n.names if a.name in ENV_READS)
    return out


def _loops(node: ast.AST) -> list[str]:
    """Where a module starts a thread (``threading.Thread(``, ``Thread(``) or loops forever
    with a sleep inside (``while True:`` ... ``sleep(`` with no ``break`` or ``return``): a
    background loop of its own. A batch loop that pauses between batches and ends is not."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "Thread":
            out.append(f"line {n.lineno}: a thread")
        elif isinstance(n, ast.While) and isinstance(n.test, ast.Constant) and n.test.value is True:
            calls = (c for c in ast.walk(n) if isinstance(c, ast.Call))
            ends = any(isinstance(c, (ast.Break, ast.Return)) for c in ast.walk(n))
            if not ends and any(
                (getattr(c.func, "attr", None) or getattr(c.func, "id", None)) == "sleep" for c in calls
            ):
                out.append(f"line {n.lineno}: a `while True` loop that sleeps")
    return out


def _imports(node: ast.AST, module: str, is_pkg: bool) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):  # every import, module level or inside a function
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            name = _from_base(n, module, is_pkg)
            out.add(name)
            out.update(f"{name}.{a.name}" for a in n.names)
    return out


def internal_graph(tree: Tree) -> dict[str, set[str]]:
    """module -> our modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    graph: dict[str, set[str]] = {}
    for module, names in tree.imports.items():
        graph[module] = {n for n in names if n in tree.imports and n != module}
    return graph


def _calls(node: ast.AST, module: str, is_pkg: bool) -> set[str]:
    """The imported names a module calls, as full names: ``Monitor(...)`` after ``from
    service.monitor import Monitor``, ``monitor.Monitor(...)`` after ``from service import monitor``."""
    local: dict[str, str] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for a in n.names:
                local[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom):
            base = _from_base(n, module, is_pkg)
            local.update({a.asname or a.name: f"{base}.{a.name}" for a in n.names})
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            parts, f = [], n.func
            while isinstance(f, ast.Attribute):
                parts.insert(0, f.attr)
                f = f.value
            if isinstance(f, ast.Name) and f.id in local:
                out.add(".".join([local[f.id], *parts]))
    return out


def _from_base(n: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved."""
    if not n.level:
        return n.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (n.level - 1)]
    return ".".join(base + ([n.module] if n.module else []))
