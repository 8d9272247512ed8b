"""One way to read an answer (judge/answer.py): the code every caller takes out of a
model's text — eval, the service, the agent loop, the TRL/verl/gym integrations."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.judge.answer import answer_of, completion_text, extract_code, read_code
from trialbox.types import Task, TaskKind

FN = Task("t", TaskKind.FUNCTION, "def add(a, b):\n", entry_point="add")
IO = Task("s", TaskKind.STDIO, "print the sum")
SOLUTION = "def add(a, b):\n    return a + b\n"
F = "```"


@pytest.mark.parametrize("text,code", [
    # a correct block followed by an output block
    (f"Here:\n{F}python\n{SOLUTION}{F}\nOutput:\n{F}\n3\n{F}\n", SOLUTION),
    (f"{F}python\n{SOLUTION}{F}\n{F}output\n3\n{F}\n", SOLUTION),
    # ... or by a usage example (it does not define the entry point)
    (f"{F}python\n{SOLUTION}{F}\nUsage:\n{F}python\nprint(add(1, 2))\n{F}\n", SOLUTION),
    # two text blocks around the code
    (f"{F}text\nthinking\n{F}\n{F}python\n{SOLUTION}{F}\n{F}text\n3\n{F}\n", SOLUTION),
    # a capitalised fence, and a python3 one
    (f"{F}Python\n{SOLUTION}{F}", SOLUTION),
    (f"{F}python3 title=sol.py\n{SOLUTION}{F}", SOLUTION),
    # backticks inside a string literal are not a fence
    (f"{F}python\ndef add(a, b):\n    s = '{F}'\n    return a + b\n{F}\n",
     f"def add(a, b):\n    s = '{F}'\n    return a + b\n"),
    # a fence opened after prose on its line, closed before more prose on its line
    (f"Here it is: {F}python\n{SOLUTION}{F} and that is all.", SOLUTION),
    # two solutions: the last that defines the entry point
    (f"{F}python\ndef add(a, b):\n    return 0\n{F}\nFixed:\n{F}python\n{SOLUTION}{F}",
     SOLUTION),
])
def test_the_solution_block_is_read_whatever_surrounds_it(text, code):
    assert read_code(FN, text) == (code, "fenced")
    assert answer_of(FN, text) == "\n" + code


@pytest.mark.parametrize("text,code,source", [
    (f"{F}python\na = 1\n{F}", "a = 1\n", "fenced"),
    (f"x\n{F}py\na = 1\n{F}\ny\n{F}python\nb = 2\n{F}", "b = 2\n", "fenced"),  # the last
    (f"{F}\na = 1\n{F}", "a = 1\n", "fenced"),
    (f"{F}python\na = 1\nb = 2", "a = 1\nb = 2", "fenced"),  # never closed: ran out
    (f"    return x\n{F}\nchatter", "    return x\n", "raw"),  # the prompt opened it
    ("    return x + 1", "    return x + 1", "raw"),
    ("  \n\t", None, ""),
    (f"{F}python\n\n{F}", None, ""),
    (f"{F}text\nonly prose\n{F}", None, ""),  # no block in the answer's language
    (f"x = '{F}'\n", f"x = '{F}'\n", "raw"),  # a literal, not a fence
])
def test_extract_code(text, code, source):
    assert extract_code(text) == (code, source)


def test_a_stdio_answer_is_read_in_its_language():
    text = (f"In C++:\n{F}cpp\n#include <cstdio>\nint main(){{}}\n{F}\n"
            f"Run it:\n{F}bash\n./a.out\n{F}\n")
    assert answer_of(IO, text, language="cpp") == "#include <cstdio>\nint main(){}\n"
    assert answer_of(IO, text, language="c++") == "#include <cstdio>\nint main(){}\n"
    assert answer_of(IO, text) == ""  # no python block: the empty answer (it fails)
    assert answer_of(IO, f"{F}python\nprint(1)\n{F}\n{F}\n1\n{F}") == "print(1)\n"


def test_chat_completions_are_read_as_their_last_assistant_message():
    chat = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": f"{F}python\n{SOLUTION}{F}"}]
    assert answer_of(FN, completion_text(chat)) == "\n" + SOLUTION
    assert completion_text({"content": "x"}) == "x"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                               {"type": "image"}, {"text": "b"}]}]
    assert completion_text(parts) == "ab"
    assert completion_text([{"role": "user", "content": "q"}]) == ""
    with pytest.raises(UsageError, match="str or a list of chat messages"):
        completion_text(3)


def test_every_caller_reads_through_the_one_reader():
    """The integrations, the agent loop and eval import the same function (no copy)."""
    from trialbox.integrations import grader, trl
    from trialbox.judge import evaluate
    from trialbox.rollout import agent, text

    assert grader.answer_of is answer_of and evaluate.answer_of is answer_of
    assert text.extract_code is extract_code and agent.read_code is read_code
    assert trl.completion_text is completion_text


def test_eval_grades_a_fenced_answer_as_the_integrations_do(runner):
    """`trialbox eval` reads a fenced answer as the integrations and the agent loop do
    (before, it appended the fence to the prompt: a syntax error, scored 0)."""
    from trialbox.integrations.grader import answer_of as integrations_read
    from trialbox.judge.evaluate import evaluate
    from trialbox.store.tasks import load_humaneval

    t = load_humaneval()[2]
    whole = t.prompt + t.canonical_solution
    chatty = f"Sure.\n{F}python\n{whole}{F}\nExample:\n{F}python\nprint({t.entry_point}(3.5))\n" \
             f"{F}\nOutput:\n{F}\n0.5\n{F}\n"
    samples = [{"task_id": t.task_id, "completion": t.canonical_solution},  # raw: as is
               {"task_id": t.task_id, "completion": chatty}]
    rows, _ = runner.run(evaluate({t.task_id: t}, samples, runner.pool, workers=1))
    assert [r.outcome.value for r in rows] == ["passed", "passed"], rows
    assert integrations_read(t, chatty) == "\n" + whole


def test_a_language_the_machine_lacks_is_the_answers_failure_not_an_error():
    """A model answering in a language the grading machine does not run: the block is
    not counted, the answer is read in the default language, finds no code and fails —
    scored 0 like any wrong answer, never an exclusion or an error that stops a batch."""
    from trialbox.judge.answer import fence_language

    text = f"In Haskell-ish:\n{F}rust\nfn main() {{}}\n{F}\n"
    assert fence_language(text) == "rust"
    assert fence_language(text, offered=["python", "cpp"]) is None
    assert answer_of(IO, text, language=fence_language(text, ["python"])) == ""
