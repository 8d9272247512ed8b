"""[tasks] and [policy]: sources (the demo family, HumanEval, JSONL/Parquet files, fsspec
URLs), train / validation / test splits, the demo's honest test split, bad input named
before anything is written, and a run on a file source and on a served model (a real
HTTP server standing in for vLLM), both through the real judge and sandboxes."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.rollout.test_openai_policy import FakeVLLM
from trialbox.errors import UsageError
from trialbox.train import demo_tasks as D
from trialbox.train.confidence import paired_rise, wilson
from trialbox.train.config import PolicyKind, config_from_dict
from trialbox.train.tasksets import EvalSplit, split_by_prompt, task_sets
from trialbox.train.trainer import run_task_sets, train, trained_on

FUNCTION_ROWS = [
    {"task_id": f"inc{i}", "prompt": f"def f(x):\n    # f(0) == {i}\n",
     "entry_point": "f", "canonical_solution": f"    return x + {i}\n",
     "test": f"def check(candidate):\n    assert candidate(0) == {i}\n"
             f"    assert candidate(2) == {i + 2}\n"}
    for i in range(20)]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sets_of(tasks_table: dict, **kw):
    config = config_from_dict({"tasks": tasks_table, **kw})
    return config, run_task_sets(config)


# --------------------------------------------------------------------------- sources

def test_a_jsonl_source_is_split_by_prompt_with_its_seed(tmp_path):
    rows = FUNCTION_ROWS + [{**FUNCTION_ROWS[0], "task_id": "inc0-again"}]  # same prompt
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    _, sets = sets_of({"source": src, "validation_fraction": 0.2, "test_fraction": 0.2,
                       "split_seed": 1}, grpo={"tasks_per_step": 2, "group_size": 2,
                                               "micro_batch": 4})
    assert (len(sets.train), len(sets.validation), len(sets.test)) in {(13, 4, 4),
                                                                       (12, 4, 5),
                                                                       (12, 5, 4)}
    splits = [{t.prompt for t in s} for s in (sets.train, sets.validation, sets.test)]
    assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])
    same = {t.task_id for s in (sets.train, sets.validation, sets.test) for t in s
            if t.prompt == FUNCTION_ROWS[0]["prompt"]}
    assert same == {"inc0", "inc0-again"}  # a prompt's tasks stay together
    from trialbox.store.tasks import load_tasks
    again = split_by_prompt(load_tasks(src), 0.2, 0.2, 1)
    other = split_by_prompt(load_tasks(src), 0.2, 0.2, 2)
    assert again == (sets.train, sets.validation, sets.test)  # the seed decides
    assert {t.task_id for t in other[2]} != {t.task_id for t in again[2]}
    # step tasks: a function of (seed, step), drawn from the train split only
    assert sets.train_step(3) == sets.train_step(3) and sets.train_step(3) != \
        sets.train_step(4)
    assert all(t in sets.train for t in sets.train_step(0))


def test_named_split_files_and_urls(tmp_path):
    import fsspec
    train_file = write_jsonl(tmp_path / "train.jsonl", FUNCTION_ROWS[:10])
    with fsspec.open("memory://trialbox-test/test.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in FUNCTION_ROWS[10:14]))
    _, sets = sets_of({"train": "file://" + train_file,
                       "test": "memory://trialbox-test/test.jsonl"},
                      grpo={"tasks_per_step": 2, "group_size": 2, "micro_batch": 4})
    assert [t.task_id for t in sets.train] == [f"inc{i}" for i in range(10)]
    assert [t.task_id for t in sets.test] == [f"inc{i}" for i in range(10, 14)]
    evals = sets.eval_tasks(EvalSplit.TEST, 3, sets.train)
    assert [t.task_id for t in evals.tasks] == ["inc10", "inc11", "inc12"]


def test_parquet_through_fsspec_and_humaneval(tmp_path):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trialbox.store.tasks import load_tasks
    with fsspec.open("memory://trialbox-test/t.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist(FUNCTION_ROWS), f)
    tasks = load_tasks("memory://trialbox-test/t.parquet")
    assert [t.task_id for t in tasks] == [r["task_id"] for r in FUNCTION_ROWS]
    assert tasks[3].hidden_tests and tasks[3].entry_point == "f"
    pq.write_table(pa.Table.from_pylist(FUNCTION_ROWS), str(tmp_path / "t.parquet"))
    local = load_tasks(str(tmp_path / "t.parquet"))
    assert [replace(t, source="") for t in local] == [replace(t, source="") for t in tasks]
    assert local[0].source == str(tmp_path / "t.parquet")
    _, sets = sets_of({"source": "humaneval"}, grpo={"steps": 0}, sft={"steps": 0})
    assert len(sets.train) + len(sets.validation) + len(sets.test) == 164
    assert len(sets.test) == 16  # round(0.1 x 164 distinct prompts)


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("table, kw, match", [
    ({"source": "nope/missing.jsonl"}, {}, r"'nope/missing.jsonl' does not exist"),
    ({"source": "file:///nope/missing.jsonl"}, {}, r"does not exist; check the URL"),
    ({"source": "memory://trialbox-test/absent.jsonl"}, {}, r"does not exist"),
    ({"source": "tasks.csv"}, {}, r"use 'humaneval' or the path or URL of a \.jsonl"),
    ({"source": "humaneval", "test_fraction": 0.0}, {},
     r"the test split that \[eval\] measures is empty; raise test_fraction"),
    ({"source": "humaneval", "validation_fraction": 0.0}, {"eval": {"split": "validation"}},
     r"validation split that \[eval\] measures is empty"),
    ({"source": "demo", "test_fraction": 0.2}, {},
     r"\[tasks\] test_fraction does not apply to source = 'demo'"),
    ({"source": "humaneval", "train": "a.jsonl"}, {}, r"either source .* not both"),
    ({"train": "a.jsonl", "split_seed": 3}, {}, r"split_seed does not apply to named"),
    ({"source": "humaneval", "validation_fraction": 0.6, "test_fraction": 0.5}, {},
     r"validation_fraction \+ test_fraction must be < 1"),
    ({"source": ""}, {}, r"\[tasks\] source is empty"),
    ({"sorce": "demo"}, {}, r"\[tasks\] unknown key 'sorce'"),
])
def test_bad_tasks_sections_name_what_to_change(tmp_path, table, kw, match):
    with pytest.raises(UsageError, match=match):
        sets_of(table, **kw)


def test_a_train_split_smaller_than_a_step_is_an_error(tmp_path):
    src = write_jsonl(tmp_path / "few.jsonl", FUNCTION_ROWS[:5])
    with pytest.raises(UsageError, match=r"train split holds 3 tasks, fewer than \[grpo\] "
                       r"tasks_per_step = 16"):
        sets_of({"source": src, "validation_fraction": 0.2, "test_fraction": 0.2})


def test_bad_input_writes_nothing(runner, tmp_path):
    out = tmp_path / "run"
    config = config_from_dict({"run": {"out_dir": str(out)},
                               "tasks": {"source": str(tmp_path / "missing.parquet")}})
    with pytest.raises(UsageError, match="does not exist"):
        runner.run(train(config, runner.pool))
    assert not out.exists()


@pytest.mark.parametrize("table, kw, match", [
    ({"kind": "openai", "base_url": "localhost:8000", "model": "m"}, {},
     r"base_url must start with http"),
    ({"kind": "openai", "base_url": "http://h/v1"}, {}, r"model must name the served"),
    ({"kind": "openai", "base_url": "http://h/v1", "model": "m"}, {},
     r"cannot update a served model's weights yet, so set \[sft\] steps = 0"),
    ({"base_url": "http://h/v1"}, {}, r"base_url only applies to kind = 'openai'"),
    ({"kind": "vllm"}, {}, r"\[policy\] kind = 'vllm': use one of local, openai"),
    ({"kind": "openai", "base_url": "http://h/v1", "model": "m", "prompt_as": "json"},
     {"sft": {"steps": 0}, "grpo": {"steps": 0}}, r"prompt_as must be 'text' or 'ids'"),
])
def test_bad_policy_sections_name_what_to_change(table, kw, match):
    with pytest.raises(UsageError, match=match):
        config_from_dict({"policy": table, **kw})


# --------------------------------------------------------------------------- the demo

def test_the_demo_test_split_is_honest():
    """Validation = the tuning draws; test: distinct prompts, none in validation, none
    sharing two examples with a prompt the run trains on (the old held-out set failed
    all three: 500 draws held 346 prompts, and every integer task shared f(0), f(1)
    with an SFT prompt)."""
    config = config_from_dict({"sft": {"steps": 300, "batch_size": 32},
                               "grpo": {"steps": 10}})
    sets = run_task_sets(config)
    trained = trained_on(config, sets)
    assert len(trained) == 2400 + 10 * 16
    test = sets.eval_tasks(EvalSplit.TEST, 300, trained)
    validation = sets.eval_tasks(EvalSplit.VALIDATION, 500, trained)
    assert [t.prompt for t in validation.tasks] == [
        t.prompt for t in D.make_tasks(D.Split.HELDOUT, 500, 12345)]  # the tuning set
    prompts = [t.prompt for t in test.tasks]
    assert len(prompts) == len(set(prompts)) == 300
    assert not set(prompts) & {t.prompt for t in validation.tasks}
    seen = set().union(*(D.example_pairs(t) for t in trained))
    assert not any(D.example_pairs(t) & seen for t in test.tasks)
    assert all(D.split_of(p) is D.Split.HELDOUT for p in prompts)
    assert test.removed["shares_examples"] > 0 and test.removed["in_validation"] > 0
    assert "sharing two examples with a training prompt" in test.note
    # the same run's test prefix does not depend on how many tasks are asked for
    fewer = sets.eval_tasks(EvalSplit.TEST, 100, trained)
    assert [t.prompt for t in fewer.tasks] == prompts[:100]
    # the old held-out draws do share examples with training prompts
    old = D.make_tasks(D.Split.HELDOUT, 500, 12345)
    assert sum(bool(D.example_pairs(t) & seen) for t in old) > 100


def test_the_demo_recipe_runs_seeds_it_was_not_tuned_on():
    from trialbox.train.demo_run import demo_config
    config = demo_config(None, None, False, None)
    assert config.run.seed not in (0, 1, 2)
    assert config.eval.split is EvalSplit.TEST and config.eval.tasks >= 500


def test_wilson_and_paired_rise():
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    mean, lo, hi = paired_rise([0] * 50 + [1] * 50, [1] * 50 + [1] * 50)
    assert mean == 0.5 and lo == pytest.approx(0.5 - 1.96 * (0.25 / 99 * 100 / 100) ** 0.5,
                                               abs=1e-3)
    assert paired_rise([1, 0], [1, 0]) == (0.0, 0.0, 0.0)


# --------------------------------------------------------------------------- real runs

@pytest.mark.slow
def test_a_run_on_a_jsonl_source(runner, tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", FUNCTION_ROWS)
    out = tmp_path / "run"
    config = config_from_dict({
        "run": {"out_dir": str(out), "seed": 1},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 320},
        "sft": {"steps": 3, "batch_size": 4},
        "grpo": {"steps": 1, "tasks_per_step": 2, "group_size": 2, "micro_batch": 4},
        "rollout": {"max_turns": 1, "max_new_tokens": 8, "env_workers": 2},
        "eval": {"tasks": 3},
        "tasks": {"source": src, "validation_fraction": 0.1, "test_fraction": 0.2}})
    result = runner.run(train(config, runner.pool), timeout=300)
    assert result.steps_done == 1
    assert result.eval_before is not None and result.eval_before["graded"] == 3
    assert result.eval_before["split"] == "test" and result.rise is not None
    lines = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert [x["kind"] for x in lines] == ["sft", "eval", "step", "eval"]


def test_a_prompt_too_long_for_the_model_is_named(runner, tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", FUNCTION_ROWS)
    config = config_from_dict({
        "run": {"out_dir": str(tmp_path / "run")},
        "grpo": {"tasks_per_step": 2, "group_size": 2, "micro_batch": 4},
        "model": {"n_positions": 128}, "tasks": {"source": src}})
    with pytest.raises(UsageError, match=r"longest prompt is \d+ tokens.*raise \[model\] "
                       "n_positions"):
        runner.run(train(config, runner.pool))
    assert not (tmp_path / "run").exists()


class ReverseServer(FakeVLLM):
    @staticmethod
    def reply(prompt: str) -> str:
        return "x[::-1]\n"  # right for exactly the x[::-1] tasks


@pytest.fixture
def served() -> Iterator[ReverseServer]:
    srv = ReverseServer()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.slow
def test_a_served_model_is_evaluated_on_the_test_split(runner, tmp_path, served):
    out = tmp_path / "run"
    config = config_from_dict({
        "run": {"out_dir": str(out)},
        "sft": {"steps": 0}, "grpo": {"steps": 0},
        "eval": {"tasks": 40},
        "policy": {"kind": "openai", "base_url": served.url + "/v1", "model": "tiny",
                   "tokenizer": "byte", "prompt_as": "ids"}})
    assert config.policy.kind is PolicyKind.OPENAI
    result = runner.run(train(config, runner.pool), timeout=300)
    tasks = run_task_sets(config).eval_tasks(EvalSplit.TEST, 40, []).tasks
    reverse = sum(t.canonical_solution == "x[::-1]\n" for t in tasks)
    assert reverse > 0 and result.eval_before is not None
    assert result.eval_before["passed"] == reverse and result.pass_before == reverse / 40
    assert len(served.bodies) == 40 and {b["model"] for b in served.bodies} == {"tiny"}
    assert sorted(b["prompt"] for b in served.bodies) == sorted(
        list(t.prompt.encode()) for t in tasks)  # the demo's raw prompts, as byte ids
    lines = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert [x["kind"] for x in lines] == ["eval"] and lines[0]["policy"] == "tiny"
    assert os.path.exists(out / "config.json") and not os.path.exists(out / "final")


def test_a_missing_demo_source_needs_no_files():
    sets = task_sets(config_from_dict({}).tasks, seed=0, tasks_per_step=2, sft_size=10,
                     training=True, eval_split=EvalSplit.TEST)
    assert sets.demo and len(sets.train_step(0)) == 2


def test_trialbox_train_with_a_missing_source_exits_2_and_writes_nothing(tmp_path, capsys):
    from trialbox.cli import main as cli_main
    bad = tmp_path / "bad.toml"
    out = tmp_path / "run"
    bad.write_text(f'[run]\nout_dir = "{out}"\n[tasks]\nsource = "{tmp_path}/none.jsonl"\n')
    assert cli_main(["train", str(bad)]) == 2  # (tests/test_cli.py: main's status is the exit's)
    err = capsys.readouterr().err
    assert f"task file '{tmp_path}/none.jsonl' does not exist" in err, err[-2000:]
    assert not out.exists()


def test_a_warm_start_without_solutions_is_named_before_writing(runner, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "canonical_solution"} for r in FUNCTION_ROWS]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    config = config_from_dict({
        "run": {"out_dir": str(tmp_path / "run")},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 320},
        "grpo": {"tasks_per_step": 2, "group_size": 2, "micro_batch": 4},
        "rollout": {"max_new_tokens": 8}, "tasks": {"source": src}})
    with pytest.raises(UsageError, match=r"no task of the train split has a "
                       r"canonical_solution to imitate; set \[sft\] steps = 0"):
        runner.run(train(config, runner.pool))
    assert not (tmp_path / "run").exists()
