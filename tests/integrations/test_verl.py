"""verl's custom reward function, called as verl's loader does: the file loaded by path
(`importlib.util.spec_from_file_location`), `compute_score` called with keyword
arguments — and by verl 0.9.1 itself (installed by the Makefile): its loader and its
`NaiveRewardManager`."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import trialbox.integrations.verl as verl_module
from trialbox.errors import UsageError
from trialbox.store.tasks import load_humaneval

ROW = {"task_id": "inline/inc", "prompt": "def inc(x):\n", "entry_point": "inc",
       "test": "def check(candidate):\n    assert candidate(1) == 2\n"}


@pytest.fixture
def loaded() -> Iterator[ModuleType]:
    """The module as verl loads `custom_reward_function.path` (verl/trainer/ppo/reward.py:
    spec_from_file_location("custom_module", path), registered in sys.modules)."""
    path = verl_module.__file__
    assert path is not None
    spec = importlib.util.spec_from_file_location("custom_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        module.shutdown()
        del sys.modules["custom_module"]


def _score(m: ModuleType, solution: str, truth: Any) -> dict[str, float]:
    out: dict[str, float] = m.compute_score(
        data_source="humaneval", solution_str=solution, ground_truth=truth,
        extra_info={"split": "train", "index": 0})
    return out


def test_compute_score_grades_task_ids_and_task_rows(loaded: ModuleType) -> None:
    he = {t.task_id: t for t in load_humaneval()}
    good = "Sure:\n```python\ndef truncate_number(number: float) -> float:\n" \
           "    return number % 1.0\n```\n"
    assert _score(loaded, good, "HumanEval/2") == {"score": 1.0, "passed": 1.0,
                                                   "excluded": 0.0}
    assert _score(loaded, he["HumanEval/2"].canonical_solution, "HumanEval/2")["score"] == 1.0
    assert _score(loaded, "    return 0.5\n", "HumanEval/2")["score"] == 0.0
    assert _score(loaded, "    return x + 1\n", ROW)["score"] == 1.0
    assert _score(loaded, "    return x\n", json.dumps(ROW))["score"] == 0.0


def test_bad_ground_truth_is_a_clear_error(loaded: ModuleType) -> None:
    with pytest.raises(UsageError, match="unknown task id 'HumanEval/999'"):
        _score(loaded, "x", "HumanEval/999")
    with pytest.raises(UsageError, match="field 'entry_point'"):
        _score(loaded, "x", {"task_id": "t", "prompt": "def f():\n", "test": "x"})


def test_a_trialbox_server_grades_when_trialbox_url_is_set(
        loaded: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.service.conftest import Server
    server = Server(token="s3cret")
    try:
        monkeypatch.setenv("TRIALBOX_URL", server.url)
        monkeypatch.setenv("TRIALBOX_TOKEN", "s3cret")
        assert _score(loaded, "    return x + 1\n", ROW)["score"] == 1.0
        assert _score(loaded, "    return number\n", "HumanEval/2")["score"] == 0.0
        assert _score(loaded, CPP_DOUBLE, IO)["score"] == 1.0  # verl's shape, in C++
        with server.client() as c:  # the grading happened there, not here
            assert c.get("/v1/submissions").json()["total"] == 3
        monkeypatch.setenv("TRIALBOX_TOKEN", "wrong")
        with pytest.raises(UsageError, match="refused the submission \\(401\\)"):
            _score(loaded, "    return x + 1\n", ROW)
    finally:
        server.stop()
    monkeypatch.setenv("TRIALBOX_TOKEN", "s3cret")  # the server is gone: excluded, not 0
    assert _score(loaded, "    return x + 1\n", ROW) == {"score": 0.0, "passed": 0.0,
                                                         "excluded": 1.0}


CPP_DOUBLE = ("In C++:\n```cpp\n#include <cstdio>\nint main(){int x; scanf(\"%d\", &x); "
              "printf(\"%d\\n\", 2 * x);}\n```\nRun it:\n```bash\n./a.out\n```\n")
IO = {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]}


def test_verls_inputs_outputs_shape_in_any_language_the_node_runs(
        loaded: ModuleType) -> None:
    """verl's code datasets give `ground_truth` as {"inputs", "outputs"} (or its JSON):
    graded as stdio tests; the answer's language from its code block or extra_info."""
    ok = {"score": 1.0, "passed": 1.0, "excluded": 0.0}
    assert _score(loaded, "```python\nprint(int(input()) * 2)\n```", IO) == ok
    assert _score(loaded, CPP_DOUBLE, json.dumps(IO)) == ok  # a C++ answer, not Python
    assert loaded.compute_score(data_source="x", solution_str="print(int(input()) * 2)",
                                ground_truth=IO, extra_info={"language": "python"}) == ok
    assert _score(loaded, "```python\nprint(int(input()) + 2)\n```", IO)["score"] == 0.0
    with pytest.raises(UsageError, match="call-based rows"):
        _score(loaded, "x", {"inputs": [], "outputs": [], "fn_name": "f"})
    with pytest.raises(UsageError, match="same length"):
        _score(loaded, "x", {"inputs": ["1\n"], "outputs": []})


def test_the_languages_the_node_runs_are_looked_up_once(
        loaded: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: `offered()` (a look at every toolchain's files) ran for every sample;
    it runs once per process (the module as verl loads it is fresh here)."""
    calls: list[int] = []
    real = loaded.offered

    def counted() -> list[str]:
        calls.append(1)
        return list(real())

    monkeypatch.setattr(loaded, "offered", counted)
    for _ in range(3):
        assert _score(loaded, CPP_DOUBLE, IO)["score"] == 1.0
    assert len(calls) == 1


def test_data_source_chooses_the_task_set(loaded: ModuleType, tmp_path: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps(ROW) + "\n")
    monkeypatch.setenv("TRIALBOX_TASK_SETS", json.dumps({"mine": str(mine)}))
    score = loaded.compute_score(data_source="mine", solution_str="    return x + 1\n",
                                 ground_truth="inline/inc")
    assert score["score"] == 1.0
    # another data source in the same process: the default set (humaneval)
    assert _score(loaded, "    return number % 1.0\n", "HumanEval/2")["score"] == 1.0
    monkeypatch.setenv("TRIALBOX_TASK_SETS", "[1]")
    with pytest.raises(UsageError, match="TRIALBOX_TASK_SETS must be a JSON object"):
        _score(loaded, "x", "HumanEval/2")


def test_an_unreachable_server_is_loud_then_an_error(
        loaded: ModuleType, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A dead TRIALBOX_URL: a warning naming it on every call (scored 0, excluded), and
    an InfraError once `TRIALBOX_MAX_UNREACHABLE` calls in a row went unanswered."""
    from trialbox.errors import InfraError
    monkeypatch.setenv("TRIALBOX_URL", "http://127.0.0.1:9")  # discard port: refused
    monkeypatch.setenv("TRIALBOX_MAX_UNREACHABLE", "3")
    monkeypatch.setattr(loaded, "_unreachable", 0)
    with caplog.at_level("WARNING"):
        for n in (1, 2):
            assert _score(loaded, "    return x + 1\n", ROW)["excluded"] == 1.0
            assert f"({n} in a row)" in caplog.text and "127.0.0.1:9" in caplog.text
        with pytest.raises(InfraError, match="answered none of the last 3"):
            _score(loaded, "    return x + 1\n", ROW)


def test_verl_itself_loads_the_module_and_its_reward_manager_scores_with_it() -> None:
    """verl 0.9.1 installed (Makefile: `--no-deps`, see there): its own loader,
    `get_custom_reward_fn` (`custom_reward_function.path/name`), loads this module from
    its file, and its own `NaiveRewardManager` decodes a `DataProto` batch and puts each
    response's trialbox score on its last valid token."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.naive import NaiveRewardManager

    from trialbox.bench.train import byte_tokenizer_fast

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": verl_module.__file__, "name": "compute_score", "reward_kwargs": {}}}})
    fn = get_custom_reward_fn(config)
    assert fn is not None
    tok = byte_tokenizer_fast()
    responses = ["```python\ndef truncate_number(number: float) -> float:\n"
                 "    return number % 1.0\n```", "    return 0.5\n", "    return x + 1\n"]
    truths = ["HumanEval/2", "HumanEval/2", json.dumps(ROW)]
    prompt = tok.encode("Solve it.")
    ids = [tok.encode(r) for r in responses]
    width = max(map(len, ids))
    resp = torch.tensor([x + [0] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(prompt) + [1] * len(x) + [0] * (width - len(x))
                         for x in ids])
    batch = DataProto.from_dict(
        tensors={"prompts": torch.tensor([prompt] * 3), "responses": resp,
                 "attention_mask": mask},
        non_tensors={"data_source": np.array(["humaneval"] * 3, dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truths],
                                              dtype=object),
                     "extra_info": np.array([{} for _ in truths], dtype=object)})
    try:
        out = NaiveRewardManager(tok, num_examine=0, compute_score=fn)(batch, return_dict=True)
        scores = out["reward_tensor"]
        last = [len(x) - 1 for x in ids]
        assert [float(scores[i, last[i]]) for i in range(3)] == [1.0, 0.0, 1.0]
        assert float(scores.sum()) == 2.0  # nothing anywhere else
        assert list(out["reward_extra_info"]["excluded"]) == [0.0, 0.0, 0.0]
    finally:
        sys.modules.pop("custom_module", None)
        verl_module.shutdown()


def test_verls_own_sandbox_fusion_client_runs_against_trialbox_serve() -> None:
    """verl's SandboxFusion reward path (`verl.utils.reward_score.sandbox_fusion`:
    `compute_score` and the `call_sandbox_api` under it, as verl's `prime_code`/sandbox
    rewards use them) pointed at `trialbox serve`'s `/run_code`: right code scores 1.0,
    wrong code 0.0, a C++ program runs, and verl's `memory_limit_MB` is honoured."""
    from verl.utils.reward_score.sandbox_fusion import compute_score as fusion_score
    from verl.utils.reward_score.sandbox_fusion.utils import call_sandbox_api

    from tests.service.conftest import Server

    server = Server()
    try:
        url = server.url + "/run_code"
        cases = {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]}
        good = "```python\nprint(int(input()) * 2)\n```"
        bad = "```python\nprint(int(input()) + 1)\n```"
        score, _meta = fusion_score(url, None, 256, good, json.dumps(cases))
        assert score == 1.0, _meta
        score, _meta = fusion_score(url, None, 256, bad, cases)
        assert score == 0.0
        out, err = call_sandbox_api(url, "#include <cstdio>\nint main(){int x; "
                                    "scanf(\"%d\",&x); printf(\"%d\\n\", x*3);}", "7\n",
                                    compile_timeout=30, run_timeout=10, memory_limit_mb=256,
                                    language="cpp")
        assert err is None and out is not None, err
        assert out["status"] == "Success" and out["run_result"]["stdout"] == "21\n", out
        hog = "x = bytearray(300 << 20)\nprint('allocated')"
        out, err = call_sandbox_api(url, hog, "", compile_timeout=10, run_timeout=10,
                                    memory_limit_mb=128, language="python")
        assert err is None and out is not None and out["status"] != "Success", out
        assert "allocated" not in out["run_result"]["stdout"]
        out, err = call_sandbox_api(url, hog, "", compile_timeout=10, run_timeout=10,
                                    memory_limit_mb=1024, language="python")
        assert out is not None and out["run_result"]["stdout"] == "allocated\n", (out, err)
    finally:
        server.stop()
