"""The TRL reward function: in a real `GRPOTrainer` (tiny local model, CPU, 2 steps) the
rewards TRL logs are trialbox's own grades, and an infrastructure failure (None) is left
out of TRL's reward, not counted as 0."""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import replace
from typing import Any

from trialbox.integrations.grader import Grader, reward_of
from trialbox.integrations.trl import AsyncTrialboxReward, TrialboxReward, completion_text
from trialbox.store.tasks import load_humaneval
from trialbox.types import Grade, Outcome, Task

ROW = {"task_id": "inline/inc", "prompt": "def inc(x):\n", "entry_point": "inc",
       "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
IDS = ["HumanEval/0", "HumanEval/2", "HumanEval/4"]


def _tasks() -> dict[str, Task]:
    """Three HumanEval tasks whose prompt already holds the canonical solution and ends in
    an open comment: the tiny random model's bytes land in the comment, so most answers
    pass the real tests (1.0) and one that breaks the line (a newline, a NUL) fails (0.0)."""
    he = {t.task_id: t for t in load_humaneval()}
    return {i: replace(he[i], prompt=he[i].prompt + he[i].canonical_solution + "\n# ")
            for i in IDS}


class _InfraFirst:
    """The real judge, except that the first completion of the first call is an INFRA
    grade (a forced machinery failure)."""

    def __init__(self) -> None:
        self.real = Grader()
        self.forced = False

    async def grade(self, task: Task, completion: str) -> Grade:
        if not self.forced:
            self.forced = True
            return Grade(task.task_id, Outcome.INFRA, message="forced by the test")
        return await self.real.grade(task, completion)

    async def close(self) -> None:
        await self.real.close()


def test_completion_text_reads_strings_and_chat_messages() -> None:
    assert completion_text("x = 1") == "x = 1"
    assert completion_text([{"role": "assistant", "content": "```python\nx\n```"}]) == \
        "```python\nx\n```"
    assert completion_text([{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "a1"},
                            {"role": "tool", "content": "t"},
                            {"role": "assistant", "content": "a2"}]) == "a2"


def test_sync_and_async_rewards_grade_through_the_judge() -> None:
    he = {t.task_id: t for t in load_humaneval()}
    good = he["HumanEval/2"].canonical_solution
    chat_good = [{"role": "assistant", "content": "```python\ndef truncate_number(number: "
                  "float) -> float:\n    return number % 1.0\n```"}]
    with TrialboxReward("humaneval") as sync:
        got = sync(prompts=["p"] * 3, completions=[good, "    return 0\n", chat_good],
                   task_id=["HumanEval/2"] * 3)
    assert got == [1.0, 0.0, 1.0]
    assert [g.passed for g in sync.grades] == [True, False, True]

    async def go() -> list[float | None]:
        reward = AsyncTrialboxReward(he, grader=_InfraFirst())
        try:
            return await reward(prompts=["p"] * 2, completions=["    return x + 1\n"] * 2,
                                task=[ROW] * 2)
        finally:
            await reward.close()
    assert asyncio.run(go()) == [None, 1.0]


def test_grpo_trainer_logs_trialbox_rewards_and_skips_none(tmp_path: Any) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from trialbox.bench.train import byte_tokenizer_fast
    from trialbox.rollout.policy import ByteTokenizer
    from trialbox.train.model import ModelConfig, build_model

    tasks = _tasks()
    torch.set_num_threads(2)
    model = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=2048),
                        ByteTokenizer(), seed=0)
    data = Dataset.from_dict({"prompt": [tasks[i].prompt for i in IDS[:2]],
                              "task_id": IDS[:2]})
    logged: list[dict[str, float]] = []

    class _Logs(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:
            if logs and "reward" in logs:
                logged.append(dict(logs))

    calls: list[list[float | None]] = []
    reward = TrialboxReward(tasks, grader=_InfraFirst())
    inner = reward.__call__

    def recording(**kw: Any) -> list[float | None]:
        out = inner(**kw)
        calls.append(out)
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, fp16=False, report_to="none",
        save_strategy="no", logging_strategy="steps", logging_steps=1, disable_tqdm=True,
        max_steps=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=4, max_completion_length=6,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-4, beta=0.0,
        shuffle_dataset=False, seed=0, dataloader_num_workers=0)
    recording.__name__ = "trialbox"  # type: ignore[attr-defined]
    try:
        trainer = GRPOTrainer(model=model, reward_funcs=[recording], args=args,
                              train_dataset=data, processing_class=byte_tokenizer_fast(),
                              callbacks=[_Logs()])
        trainer.train()
    finally:
        reward.close()

    assert len(calls) == 2 and len(logged) == 2, (calls, logged)
    assert calls[0][0] is None  # the forced infrastructure failure
    assert [reward_of(g) for g in reward.grades[1:]] == calls[0][1:] + calls[1]
    for rewards, logs in zip(calls, logged, strict=True):
        scored = [r for r in rewards if r is not None]
        mean = sum(scored) / len(scored)
        assert math.isclose(logs["rewards/trialbox/mean"], mean, abs_tol=1e-6)
        assert math.isclose(logs["reward"], mean, abs_tol=1e-6)
    # None is skipped, not 0: counting it as 0 would give a different mean
    first = [r for r in calls[0] if r is not None]
    assert sum(first) > 0, f"no passing answer in the first step ({calls[0]}): the check " \
                           "that None is not 0 needs one"
    assert not math.isclose(logged[0]["reward"], sum(first) / len(calls[0]))


def test_a_stdio_answer_is_graded_in_its_own_language() -> None:
    """Issue 30: the TRL reward graded every stdio answer as Python. The language comes
    from the dataset's `language` column, else the answer's code block (a ```cpp answer
    is C++); each row its own."""
    double = {"task_id": "io/double", "kind": "stdio", "prompt": "Print twice the int.",
              "tests": [{"stdin": "2\n", "expected": "4\n"}, {"stdin": "5\n", "expected": "10\n"}]}
    cpp = ("```cpp\n#include <cstdio>\nint main(){int x; scanf(\"%d\", &x); "
           "printf(\"%d\\n\", 2 * x);}\n```")
    py = "```python\nprint(2 * int(input()))\n```"
    with TrialboxReward([]) as reward:
        rows = [double] * 4
        assert reward(completions=[cpp, py, cpp, "print(2 * int(input()))"], task=rows,
                      language=[None, None, "cpp", "python"]) == [1.0, 1.0, 1.0, 1.0]
        assert reward(completions=[[{"role": "assistant", "content": cpp}]],
                      task=[double]) == [1.0]
        assert reward(completions=[cpp], task=[double], language=["python"]) == [0.0]


class _Languages:
    """A fake grader recording the language each stdio answer was graded in."""

    def __init__(self) -> None:
        self.languages: list[str | None] = []

    async def grade(self, task: Task, completion: str, language: str | None = None,
                    **_: Any) -> Grade:
        self.languages.append(language)
        return Grade(task.task_id, Outcome.PASSED)


def test_the_languages_the_machine_runs_are_looked_up_once(monkeypatch: Any) -> None:
    """Issue 30: `offered()` (a look at every toolchain's files) ran for every completion
    of every call; a reward function looks once, at its first fenced stdio answer."""
    from trialbox.sandbox.languages import offered
    calls: list[int] = []

    def counted() -> list[str]:
        calls.append(1)
        return offered()

    monkeypatch.setattr("trialbox.integrations.trl.offered", counted)
    double = {"task_id": "io/double", "kind": "stdio", "prompt": "Print twice the int.",
              "tests": [{"stdin": "2\n", "expected": "4\n"}]}
    cpp, py = "```cpp\nint main(){}\n```", "```python\nprint(1)\n```"
    for cls in (TrialboxReward, AsyncTrialboxReward):
        calls.clear()
        fake = _Languages()
        reward = cls([], grader=fake)
        for _ in range(3):
            got = reward(completions=[cpp, py, cpp], task=[double] * 3)
            if asyncio.iscoroutine(got):
                got = asyncio.run(got)
            assert got == [1.0, 1.0, 1.0]
        assert fake.languages == ["cpp", "python", "cpp"] * 3
        assert len(calls) == 1, cls.__name__
        if isinstance(reward, TrialboxReward):
            reward.close()
