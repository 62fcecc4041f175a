"""The house's import graph (#49): no circle between modules (imports at module level), and between rooms
(datapipe's sub-packages and top-level modules, lazy imports included) no arrow back up: each room imports
only rooms on a lower floor. datapipe/ keeps at most 12 top-level modules, and each package says in its
docstring what it may import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "datapipe"
# The floors, lowest first: a room may import the rooms of the floors below its own.
FLOORS = [
    {"errors", "checks", "names", "resources", "devices"},  # the leaves
    {"records", "pool_sizing"},
    {"order", "image", "storage"},
    {"ray_setup", "formats", "augment"},  # ray_setup: its messages are redacted (an address may hold a password)
    {"ray_local"},
    {"mix"},
    {"backends"},
    {"preview", "bench", "train"},
    {"doctor"},
    {"cli"},
    {"__main__"},
]
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str, *, eager: bool) -> set[str]:
    """The datapipe modules `name` imports (at module level only where `eager`)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in (tree.body if eager else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("datapipe") and target != name:
                found.add(target)
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_circle_between_modules():
    assert cycle({m: imports(m, eager=True) for m in MODULES}) is None


def test_no_arrow_back_up_between_rooms():
    rooms = {room(m) for m in MODULES} - {"__init__"}
    assert rooms <= set(FLOOR), f"a room without a floor: {sorted(rooms - set(FLOOR))} (add it to FLOORS)"
    up = sorted((m, t) for m in MODULES if room(m) != "__init__" for t in imports(m, eager=False)
                if room(t) not in (room(m), "__init__") and FLOOR[room(t)] >= FLOOR[room(m)])
    assert not up, up


def test_at_most_twelve_top_level_modules_and_every_package_says_what_it_may_import():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 12, top
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE or init.parent.parent != PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}'s docstring does not say what it may import"
