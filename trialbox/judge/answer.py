"""One way to read an answer: the code in a model's text, as every caller grades it.

`trialbox eval`, the service's `/v1/submissions`, the agent loop and the TRL / verl / gym
integrations all take the code out of a model's output here, so an offline pass@1 and a
training reward read the same text the same way (DESIGN.md, decision 9).

    >>> answer_of(Task("t", TaskKind.STDIO, "p"), "Sure:\\n```python\\nprint(1)\\n```\\n"
    ...           "Output:\\n```\\n1\\n```")
    'print(1)\\n'

The rules, in order (`extract_code`):

* A block opens with three backticks at the start of a line or after a space ("Here:
  ```python"), its info string naming a language (```` ```Python ````, ```` ```py ````,
  ```` ```python3 ```` — any case), and closes with three backticks at the start of a
  line. Backticks inside a line of code (a string literal such as '```') do neither.
* Of the complete blocks, the candidates are those in the answer's language (its names
  in `LANGUAGE_TAGS`) and bare ones; blocks tagged as another language or as output
  (```` ```text ````, ```` ```output ````, ```` ```bash ````, ...) are never the answer.
* With an entry point (a function task), the last candidate that defines it wins — a
  usage example after the solution does not replace it; else the last tagged candidate;
  else the last bare one.
* A block opened but never closed (the model ran out of tokens) is the answer when no
  block was complete.
* No fence at all: the whole text is the answer ("raw", a completion-style model
  continuing the prompt). A lone closing fence after raw code ends it (it closes a
  block the prompt itself opened).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from trialbox.errors import UsageError
from trialbox.sandbox.languages import ALIASES
from trialbox.types import Task, TaskKind

_OPEN = re.compile(r"(?:^|(?<=\s))```[ \t]*([\w+#.-]*)[^\n`]*\n", re.MULTILINE)
"""An opening fence: ``` at the start of a line or after a space, then an optional info
string (its first word is the language), then the end of the line."""
_CLOSE = re.compile(r"^[ \t]*```", re.MULTILINE)
"""A closing fence: ``` at the start of a line."""

LANGUAGE_TAGS: dict[str, frozenset[str]] = {
    "python": frozenset({"python", "python3", "py", "py3", "python2"}),
    "c": frozenset({"c", "h"}),
    "cpp": frozenset({"cpp", "c++", "cxx", "cc", "hpp"}),
    "java": frozenset({"java"}),
    "go": frozenset({"go", "golang"}),
    "rust": frozenset({"rust", "rs"}),
    "nodejs": frozenset({"javascript", "js", "node", "nodejs"}),
    "typescript": frozenset({"typescript", "ts"}),
    "bash": frozenset({"bash", "sh", "shell"}),
}
"""Info strings naming each language (lower case). A language not listed matches its
own name only."""


def _tags(language: str) -> frozenset[str]:
    key = ALIASES.get(language, language)
    return LANGUAGE_TAGS.get(key, frozenset({key.lower()}))


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is; a chat completion (a list of messages, or one
    message dict) as the content of its last assistant message (multimodal parts: the
    text ones, joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        said = [m for m in completion if isinstance(m, dict)
                and m.get("role", "assistant") == "assistant"]
        if said:
            content = said[-1].get("content")
            if isinstance(content, list):  # multimodal parts: keep the text ones
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str))
            return content if isinstance(content, str) else ""
        return ""
    raise UsageError(f"a completion must be a str or a list of chat messages, got "
                     f"{type(completion).__name__}")


def fence_language(text: str, offered: Collection[str] | None = None) -> str | None:
    """The language an answer's code blocks are tagged with, by its trialbox name
    (```` ```c++ ```` -> "cpp", ```` ```py ```` -> "python"): the last tagged block's, a shell
    block after a program (how to run it) not counting; None when no block names a
    language ("text", "output", bare fences). With `offered` (the languages the grading
    machine runs), a block in another language is not counted: the answer is then read
    in the default language, finds no code, and fails as the candidate's own answer —
    never an exclusion, never an error that stops a batch.

    >>> fence_language("In C++:\\n```cpp\\nint main(){}\\n```\\nRun:\\n```bash\\n./a\\n```")
    'cpp'
    >>> fence_language("```text\\nhi\\n```") is None
    True
    """
    found: list[str] = []
    pos = 0
    while (m := _OPEN.search(text, pos)) is not None:
        close = _CLOSE.search(text, m.end())
        if close is None:
            break
        tag = m.group(1).lower()
        found += [lang for lang, tags in LANGUAGE_TAGS.items() if tag in tags
                  and (offered is None or lang in offered)][:1]
        pos = close.end()
    programs = [x for x in found if x not in _SHELLS]
    chosen = programs or found
    return chosen[-1] if chosen else None


_SHELLS = frozenset({"bash", "sh"})


def _defines(code: str, entry_point: str) -> bool:
    name = re.escape(entry_point)
    return re.search(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{name}\b|^{name}[ \t]*=",
                     code, re.MULTILINE) is not None


def extract_code(text: str, *, language: str = "python",
                 entry_point: str | None = None) -> tuple[str | None, str]:
    """The code in a model's output and where it came from: "fenced" or "raw", or
    (None, "") when there is nothing but whitespace. The rules: this module's docstring.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    ('def f():\\n    return 1\\n', 'fenced')
    >>> extract_code("    return x + 1\\n")
    ('    return x + 1\\n', 'raw')
    """
    wanted = _tags(language)
    blocks: list[tuple[str, str]] = []  # (tag, code) of each complete block
    pos, opened = 0, None
    while (m := _OPEN.search(text, pos)) is not None:
        close = _CLOSE.search(text, m.end())
        if close is None:
            opened = m  # never closed
            break
        blocks.append((m.group(1).lower(), text[m.end():close.start()]))
        pos = close.end()
    tagged = [c for tag, c in blocks if tag in wanted]
    bare = [c for tag, c in blocks if tag == ""]
    candidates = tagged + bare
    code: str | None = None
    source = "fenced"
    if entry_point:
        defining = [c for tag, c in blocks if (tag in wanted or tag == "")
                    and _defines(c, entry_point)]
        code = defining[-1] if defining else None
    if code is None and candidates:
        code = tagged[-1] if tagged else bare[-1]
    if code is None and not blocks and opened is not None:
        before = text[:opened.start()]
        tag = opened.group(1).lower()
        if tag in wanted or (tag == "" and not before.strip()):
            code = text[opened.end():]  # ran out of tokens inside the block
        elif tag == "":  # a bare fence after code closes a block the prompt opened
            code, source = before, "raw"
    if code is None and not blocks and opened is None:
        code, source = text, "raw"
    if code is None or not code.strip():
        return None, ""
    return code, source


def read_code(task: Task, text: str, *,
              language: str | None = None) -> tuple[str | None, str]:
    """`extract_code` as `task` asks: a function task's answer defines its entry point; a
    stdio program is in `language` (default python)."""
    if task.kind is TaskKind.FUNCTION:
        return extract_code(text, entry_point=task.entry_point or None)
    return extract_code(text, language=language or "python")


def answer_of(task: Task, text: str, *, language: str | None = None) -> str:
    """What the judge grades from a model's text (`read_code`): for a function task, a
    fenced answer is a whole function appended after the prompt on a new line (it
    redefines the stub) and a raw one continues the prompt; for a stdio task, the whole
    program. "" when the text holds no code (graded as the empty answer: it fails)."""
    code, source = read_code(task, text, language=language)
    if code is None:
        return ""
    return "\n" + code if source == "fenced" and task.kind is TaskKind.FUNCTION else code
