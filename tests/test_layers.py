"""The house's layering (DESIGN.md): data flows one way and no lower layer imports an
upper one — `types/errors` ← `sandbox` ← `judge` ← `schedule` ← `rollout` ← `train`;
`store` and `telemetry` are used by all and import only the vocabulary; `service`,
`cluster`, `bench` and `cli` sit on top. Every import counts, the ones inside functions
and under TYPE_CHECKING too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trialbox"

# Each part and the parts it may import (besides itself). The order is the design's.
_ORDER = ["sandbox", "judge", "schedule", "rollout", "train"]
_BASE = {"types", "errors", "store", "telemetry"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "types": {"errors"},
    "store": {"types", "errors", "telemetry"},
    "telemetry": {"types", "errors", "store"},
    **{part: _BASE | set(_ORDER[:i]) for i, part in enumerate(_ORDER)},
    "service": _BASE | set(_ORDER),
    "cluster": _BASE | set(_ORDER),
    "integrations": _BASE | set(_ORDER),
    "bench": _BASE | set(_ORDER) | {"service", "cluster"},
    "cli": _BASE | set(_ORDER) | {"service", "cluster", "bench"},
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
