"""Every exception class trialbox defines is drawn in errors.py's docstring and parented
there (STYLE.md 6): a new exception cannot appear without saying which of the three kinds
of failure it is."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import trialbox.errors as errors

PACKAGE = Path(__file__).resolve().parents[1] / "trialbox"
# Programs that run inside sandboxes under the system interpreter: their exceptions are
# private signals of those processes.
STANDALONE = {"sandbox/zygote.py", "judge/harness_program.py", "judge/candidate_stub.py",
              "judge/repo_plugin.py", "judge/codec.py", "service/jupyter_driver.py"}
ROOTS = (errors.TrialboxError, errors.CandidateFault)


def defined_exceptions() -> list[tuple[str, type[BaseException]]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in STANDALONE:
            continue
        tree = ast.parse(path.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and not n.name.startswith("_")]
        if not names:
            continue
        module = importlib.import_module(
            "trialbox." + rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))
        for name in names:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append((f"{module.__name__}.{name}", cls))
    return found


def test_every_exception_is_parented_in_errors_py() -> None:
    orphans = [name for name, cls in defined_exceptions() if not issubclass(cls, ROOTS)]
    assert orphans == [], ("parent these under a class of trialbox/errors.py (which kind "
                           f"of failure are they?): {orphans}")


def test_every_exception_is_drawn_in_the_tree() -> None:
    doc = errors.__doc__ or ""
    missing = [name for name, _ in defined_exceptions()
               if name.removeprefix("trialbox.").removeprefix("errors.") not in doc]
    assert missing == [], f"draw these in errors.py's docstring: {missing}"


def test_the_check_finds_the_known_ones() -> None:
    names = {name for name, _ in defined_exceptions()}
    assert {"trialbox.errors.InfraError", "trialbox.store.journal.JournalError",
            "trialbox.store.patches.TreeError"} <= names
