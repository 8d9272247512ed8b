"""The house's layering (DESIGN.md): data flows one way and no lower layer imports an
upper one — `types/errors/versions` ← `sandbox` ← `judge` ← `schedule` ← `rollout` ←
`train`; `store` and `telemetry` are used by all and import only the vocabulary;
`cluster` (the Ray backend: node actors grading with the judge, placement under the
scheduler's journal, `train --backend ray`), `service`, `integrations`, `bench` and
`cli` sit on top. What a lower layer needs of the cluster is defined below it: `NodeLost`
in errors.py (the agent loop and the service catch it), the software check in
versions.py (the policy fleet makes it too). Every import counts, the ones inside
functions and under TYPE_CHECKING too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trialbox"

# Each part and the parts it may import (besides itself). The order is the design's.
_ORDER = ["sandbox", "judge", "schedule", "rollout", "train"]
_BASE = {"types", "errors", "versions", "store", "telemetry"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "types": {"errors"},
    "versions": {"errors"},
    "store": {"types", "errors", "telemetry"},
    "telemetry": {"types", "errors", "store"},
    **{part: _BASE | set(_ORDER[:i]) for i, part in enumerate(_ORDER)},
    "cluster": _BASE | set(_ORDER),
    "service": _BASE | set(_ORDER) | {"cluster"},
    "integrations": _BASE | set(_ORDER) | {"cluster"},
    "bench": _BASE | set(_ORDER) | {"cluster", "service"},
    "cli": _BASE | set(_ORDER) | {"cluster", "service", "bench"},
    "__init__": set(),
}


def _part(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported trialbox module) for every import in one file."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "trialbox":
                found += [(node.lineno, f"trialbox.{a.name}") for a in node.names]
            elif node.module.startswith("trialbox."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name == "trialbox" or a.name.startswith("trialbox.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write "
                                 f"`from trialbox.… import …`, so layering can be checked")
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        here = _part(".".join(rel.parts))
        assert here in ALLOWED, f"{path}: part {here!r} has no place in the layering; " \
                                f"add it to ALLOWED in tests/test_layers.py"
        for line, module in imports_of(path):
            there = _part(module)
            if there != here and there not in ALLOWED[here]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports "
                           f"{module} ({there} is above or beside it)")
    return bad


def test_no_layer_imports_one_above_it() -> None:
    assert violations() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from trialbox.train.trainer import Trainer\n"
                 "from trialbox import cli\n")
    assert sorted(imports_of(f)) == [(2, "trialbox.train.trainer"), (3, "trialbox.cli")]


# The namespace tier's modules, lowest first: each imports (at import time) only the ones
# before it. A session (namespace.py) supervises its runs (supervisor.py) in cells of the
# warm pool (pool.py), which speaks to the zygote (zygote_client.py) and reaps what dead
# pools left (reaper.py). The references back up — a cell's pool, a run's session, the
# pool's `open` returning a session — are type-only or inside a function.
NAMESPACE_TIER = ["reaper", "zygote_client", "pool", "supervisor", "namespace"]


def top_level_imports(path: Path) -> set[str]:
    """The trialbox modules a file imports when it is imported: module-level imports,
    not those under `if TYPE_CHECKING:` or inside functions."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "trialbox.sandbox":
                found |= {f"trialbox.sandbox.{a.name}" for a in node.names}
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_the_namespace_tier_modules_import_downward() -> None:
    bad = []
    for i, name in enumerate(NAMESPACE_TIER):
        path = PACKAGE / "sandbox" / f"{name}.py"
        for above in NAMESPACE_TIER[i + 1:]:
            if f"trialbox.sandbox.{above}" in top_level_imports(path):
                bad.append(f"sandbox/{name}.py imports sandbox/{above}.py")
    assert bad == []


def test_the_downward_check_sees_a_module_level_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nfrom trialbox.sandbox import pool\n"
                 "if TYPE_CHECKING:\n    from trialbox.sandbox.namespace import X\n"
                 "def f():\n    from trialbox.sandbox.supervisor import Run\n")
    assert top_level_imports(f) == {"typing", "trialbox.sandbox", "trialbox.sandbox.pool"}
