"""Paths and unified diffs of a repository task's file tree: the rules a tree path
obeys (`clean_path`) and applying a candidate's diff (`apply_patch`). Below the judge:
the task store validates repo rows with them and the judge builds candidate trees
(`trialbox/judge/repo_tree.py`).

    >>> clean_path("./pkg//mod.py")
    'pkg/mod.py'
"""

from __future__ import annotations

import ast
import re

from trialbox.errors import CandidateFault

MAX_PATH = 4096


class TreeError(CandidateFault):
    """The candidate's answer cannot become a tree (bad patch, bad path): its failure."""


def clean_path(raw: str) -> str:
    """A tree path: relative, `/`-separated, normalised, inside the tree. `TreeError`
    otherwise."""
    if not isinstance(raw, str) or not raw or "\x00" in raw or len(raw) > MAX_PATH:
        raise TreeError(f"bad path {raw!r}: give a relative path inside the repository")
    if raw.startswith("/") or "\\" in raw:
        raise TreeError(f"bad path {raw!r}: paths are relative and use '/'")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise TreeError(f"bad path {raw!r}: it must name a file inside the repository")
    return "/".join(parts)


# --------------------------------------------------------------------------- patches

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(files: dict[str, bytes], patch: str) -> dict[str, bytes]:
    """Apply a unified diff (`git diff` or `diff -u` output) to `files`; a new dict.

    Hunks must match the file exactly (context and removed lines), at their line or, if
    the file moved, at one other place; file creation (`--- /dev/null`) and deletion
    (`+++ /dev/null`) are supported; renames, binary patches and symlinks are not.
    `a/` and `b/` prefixes are dropped. Raises `TreeError` saying what did not apply.

    >>> diff = "--- a/f.py\\n+++ b/f.py\\n@@ -1 +1 @@\\n-x = 1\\n+x = 2\\n"
    >>> apply_patch({"f.py": b"x = 1\\n"}, diff)
    {'f.py': b'x = 2\\n'}
    """
    out = dict(files)
    lines = diff_lines(patch)
    i, touched = 0, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("rename from", "rename to", "copy from", "GIT binary patch",
                            "Binary files")):
            raise TreeError(f"patch line {i + 1}: {line.strip()!r} is not supported; send "
                            "renames as a deletion and a creation, text files only")
        if line.startswith(("new file mode 12", "new mode 12", "deleted file mode 12")):
            raise TreeError(f"patch line {i + 1}: symbolic links are not supported")
        if not (line.startswith("--- ") and i + 1 < len(lines)
                and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_path = _patch_path(line[4:], i + 1)
        new_path = _patch_path(lines[i + 1][4:], i + 2)
        i += 2
        if old_path is not None and new_path is not None and old_path != new_path:
            # `diff -u calc.py.orig calc.py` names two files for one: the one that
            # exists is meant (renames are refused below, so it cannot move a file).
            old_path = new_path = new_path if new_path in out else old_path
        target = new_path or old_path
        if target is None:
            raise TreeError(f"patch line {i - 1}: both sides are /dev/null")
        if old_path is None:
            if target in out:
                raise TreeError(f"patch creates {target}, which already exists")
            text: list[str] = []
        else:
            if old_path not in out:
                raise TreeError(f"patch changes {old_path}, which does not exist")
            text = diff_lines(out[old_path].decode("utf-8", "surrogateescape"))
        hunks = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _read_hunk(lines, i)
            hunks.append(hunk)
        if not hunks:
            raise TreeError(f"patch for {target}: no hunks")
        offset = 0
        for start, old, new in hunks:
            at = _find(text, old, start - 1 + offset if old else start + offset, target)
            text[at:at + len(old)] = new
            offset += len(new) - len(old)
        touched += 1
        if new_path is None:
            if text:
                raise TreeError(f"patch deletes {old_path} but leaves lines in it")
            del out[target]
        else:
            out[target] = "".join(text).encode("utf-8", "surrogateescape")
    if not touched:
        raise TreeError("the patch changes no file (no '--- a/...' / '+++ b/...' header "
                        "followed by hunks); send a unified diff")
    return out


def diff_lines(text: str) -> list[str]:
    """Lines with their ends, split at "\n" only (`str.splitlines` also splits at form
    feeds and other separators that diff tools treat as ordinary characters)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _patch_path(header: str, lineno: int) -> str | None:
    path = header.rstrip("\r\n").split("\t")[0].strip()
    if path == "/dev/null":
        return None
    if path.startswith('"'):
        try:
            path = ast.literal_eval(path)
        except (ValueError, SyntaxError):
            raise TreeError(f"patch line {lineno}: bad quoted path {path!r}") from None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return clean_path(path)


def _read_hunk(lines: list[str], i: int) -> tuple[tuple[int, list[str], list[str]], int]:
    m = _HUNK.match(lines[i])
    if not m:
        raise TreeError(f"patch line {i + 1}: bad hunk header {lines[i].strip()!r}")
    old_start = int(m.group(1))
    old_n = int(m.group(2)) if m.group(2) is not None else 1
    new_n = int(m.group(4)) if m.group(4) is not None else 1
    i += 1
    old: list[str] = []
    new: list[str] = []
    while i < len(lines) and (len(old) < old_n or len(new) < new_n):
        line = lines[i]
        kind, body = line[:1], line[1:]
        if line in ("\n", "\r\n"):  # an empty context line whose space was stripped
            kind, body = " ", line
        if kind == " ":
            old.append(body)
            new.append(body)
        elif kind == "-":
            old.append(body)
        elif kind == "+":
            new.append(body)
        elif kind != "\\":
            raise TreeError(f"patch line {i + 1}: unexpected {line.rstrip()!r} inside a "
                            "hunk (counts in the @@ header do not match its lines)")
        i += 1
        while i < len(lines) and lines[i].startswith("\\"):  # "\ No newline at end of file"
            for side, kinds in ((old, " -"), (new, " +")):
                if kind in kinds and side:
                    side[-1] = side[-1].rstrip("\r\n")
            i += 1
    if len(old) != old_n or len(new) != new_n:
        raise TreeError(f"patch: a hunk ends early (header says -{old_n} +{new_n}, found "
                        f"-{len(old)} +{len(new)} lines)")
    return (old_start, old, new), i


def _find(text: list[str], old: list[str], at: int, path: str) -> int:
    """Where the hunk's old lines are: at `at`, else the one other place they match."""
    at = max(0, min(at, len(text)))
    if text[at:at + len(old)] == old:
        return at
    places = [k for k in range(len(text) - len(old) + 1) if text[k:k + len(old)] == old]
    if len(places) == 1:
        return places[0]
    why = "nowhere" if not places else f"at {len(places)} places"
    raise TreeError(f"patch does not apply to {path}: a hunk's context near line "
                    f"{at + 1} matches {why}")
