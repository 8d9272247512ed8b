"""Resuming `trialbox train`, on the real namespace tier and the real judge.

A short run then resumed, once per way to train (GRPO, PPO, async): each checkpoints
every step and goes on from the last checkpoint, and shows what is its own (traces and
pass@1; the value head; policy versions and the staleness bound). The journaled
scheduler: every episode a task with all its transitions, `trialbox tasks status`
reading the live run, and `kill -9` at five points (with part of a step's episodes
finished, while the judge grades, inside an update, at a random moment) each resumed
with `--resume`: 0 lost episodes, 0 duplicate rewards, finished episodes never run
again, and the final records equal the uninterrupted run's. And what cannot be resumed
is named before anything is written."""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests.schedule.journal_checks import check_journal
from tests.train.crash_train import launcher
from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.train import pipeline
from trialbox.train.config import TrainConfig, config_from_dict, with_changes
from trialbox.train.episodes import episode_task_id
from trialbox.train.model import load_model
from trialbox.train.ppo import VALUE_HEAD_FILE
from trialbox.train.trainer import TrainResult, train, train_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The smallest run with signal in its updates: PPO's value head makes every update move
# the weights (an untrained policy fails every task, so GRPO's advantages would all be 0).
CONFIG = {
    "run": {"seed": 1, "checkpoint_every": 2, "threads": 1},
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
    "sft": {"steps": 5, "batch_size": 8},
    "grpo": {"steps": 4, "tasks_per_step": 2, "group_size": 2, "micro_batch": 2,
             "algorithm": "ppo"},
    "rollout": {"max_turns": 2, "max_new_tokens": 8, "env_workers": 2},
    "eval": {"tasks": 0}}


def toml(d: dict) -> str:
    out = []
    for section, table in d.items():
        out.append(f"[{section}]")
        out += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(out) + "\n"


def journal_rows(db: str) -> tuple[dict, dict]:
    """({task: (state, reward)}, {(task, attempt): trajectory})."""
    c = sqlite3.connect(db)
    try:
        results = {t: (s, r) for t, s, r in c.execute(
            "SELECT task_id, state, reward FROM results")}
        trajs = {(t, a): json.loads(d)["trajectory"] for t, a, d in c.execute(
            "SELECT task_id, attempt, data FROM grades")}
    finally:
        c.close()
    return results, trajs


def the_record(tr: dict) -> dict:
    return {k: tr[k] for k in ("token_ids", "loss_mask", "old_logprobs", "reward",
                               "stop_reason", "turns")} | {
        "turns": [{k: t[k] for k in ("output_ids", "logprobs", "feedback_ids", "outcome")}
                  for t in tr["turns"]]}


def final_records(out: str) -> tuple[dict, dict, list, dict]:
    results, trajs = journal_rows(os.path.join(out, "journal.db"))
    rewarded = {t: the_record(tr) for (t, _), tr in trajs.items()
                if tr["reward"] is not None}
    steps = []
    for line in open(os.path.join(out, "metrics.jsonl")):
        x = json.loads(line)
        if x["kind"] in ("step", "skip"):
            steps.append({k: x[k] for k in ("step", "reward", "pass_rate", "loss", "kl",
                                            "clip_frac", "grad_norm", "value_loss",
                                            "turns", "model_tokens", "trained_on")})
    from safetensors.torch import load_file
    weights = load_file(os.path.join(out, "final", "model.safetensors"))
    return results, rewarded, steps, weights


# ------------------------------------------------------------ a short run, then resume

def metrics(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]


def step_lines(out: str) -> list[dict[str, Any]]:
    return [x for x in metrics(out) if x["kind"] in ("step", "skip")]


def weights_moved(out: str) -> bool:
    """Whether the final weights differ from the warm start's."""
    final, _ = load_model(os.path.join(out, "final"))
    sft_model, _ = load_model(os.path.join(out, "sft"))
    return not all(torch.equal(a, b) for a, b in
                   zip(final.parameters(), sft_model.parameters(), strict=True))


class Variant:
    """A way to train: the short run's config (changes to SHORT), its steps and the
    total after resuming, and what it shows beyond what every run does."""
    changes: dict[str, dict[str, Any]] = {}
    steps, resumed_steps = 2, 3

    def config(self, out: str) -> TrainConfig:
        d = {k: SHORT[k] | self.changes.get(k, {}) for k in SHORT}
        return config_from_dict(d | {"run": d["run"] | {"out_dir": out}})

    def run(self, runner: Any, config: TrainConfig, monkeypatch: Any) -> TrainResult:
        result: TrainResult = runner.run(train(config, runner.pool), timeout=300)
        return result

    def check_run(self, result: TrainResult, out: str) -> None:
        pass

    def check_resumed(self, runner: Any, out: str, more: TrainConfig) -> None:
        pass


SHORT: dict[str, dict[str, Any]] = {
    "run": {"seed": 1, "checkpoint_every": 1},
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
    "sft": {"steps": 5, "batch_size": 8},
    "grpo": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "micro_batch": 2},
    "rollout": {"max_turns": 2, "max_new_tokens": 8, "env_workers": 2},
    "eval": {"tasks": 0}}


class Grpo(Variant):
    """Each iteration one trace (its episodes and its training step under it), a point
    per step on the run page's curve, pass@1 before and after, the progress events,
    TensorBoard's files."""
    changes = {"eval": {"tasks": 4}}

    def run(self, runner: Any, config: TrainConfig, monkeypatch: Any) -> TrainResult:
        events: list[str] = []
        with telemetry.capture() as exported, telemetry.use_metrics() as recorded:
            result: TrainResult = runner.run(
                train(config, runner.pool, lambda e, r: events.append(e)), timeout=300)
        spans = exported.get_finished_spans()
        iterations = [s for s in spans if s.name == "train.iteration"]
        assert [s.attributes["train.step"] for s in iterations] == [1, 2]
        for it in iterations:
            under = {s.name for s in spans if s.parent is not None
                     and s.parent.span_id == it.context.span_id}
            assert {"episode", "model.generate", "train.step"} <= under, under
        points = list(recorded.recent.runs["run"])  # the run page's curve (run id: out dir)
        assert [p["step"] for p in points] == [1, 2] and all("reward_mean" in p
                                                             for p in points)
        assert events.count("step") == 2 and events.count("eval") == 2
        return result

    def check_run(self, result: TrainResult, out: str) -> None:
        assert result.pass_before is not None and result.pass_after is not None
        for x in step_lines(out):
            assert x["excluded"] == 0 and x["tokens_per_s"] > 0
            assert 0.0 <= x["pass_rate"] <= 1.0
        assert [x["when"] for x in metrics(out) if x["kind"] == "eval"] == [0, 2]
        assert os.listdir(os.path.join(out, "tb"))

    def check_resumed(self, runner: Any, out: str, more: TrainConfig) -> None:
        # pass@1 after the resumed run, no second "before" (when 0)
        assert [x["when"] for x in metrics(out) if x["kind"] == "eval"] == [0, 2, 3]


class Ppo(Variant):
    """The value head's loss is logged (partial credit: rewards are non-zero even for a
    barely trained model, so the critic, which starts at 0, has something to fit), the
    head is checkpointed and comes back on resume, and a checkpoint without it (as
    GRPO's) is refused naming the file."""
    changes = {"grpo": {"algorithm": "ppo"}, "rollout": {"reward": "pass_rate"}}

    def check_run(self, result: TrainResult, out: str) -> None:
        for x in step_lines(out):
            assert x["trained_on"] == 4 - x["excluded"]
            assert x["reward"] != 0   # so some return is non-zero: the critic has an error
            assert math.isfinite(x["value_loss"]) and x["value_loss"] > 0
            assert math.isfinite(x["loss"])
        saved = torch.load(os.path.join(out, "checkpoint", VALUE_HEAD_FILE))
        assert set(saved) == {"linear.weight", "linear.bias"}
        assert os.path.exists(os.path.join(out, "final", VALUE_HEAD_FILE))

    def check_resumed(self, runner: Any, out: str, more: TrainConfig) -> None:
        os.remove(os.path.join(out, "checkpoint", VALUE_HEAD_FILE))
        with pytest.raises(UsageError, match=r"holds no value_head.pt"):
            runner.run(train(with_changes(more, grpo={"steps": 4}), runner.pool))


class Async(Variant):
    """`[rollout] mode = "async"`: every trajectory carries its sampler's policy version,
    the staleness bound is kept (the third batch waits for the first update's weights),
    the model does one thing at a time, the weights move; on resume the batches in
    flight were not saved: the producer restarts at the checkpoint's step with its
    weights (staleness 0 for the first batch)."""
    changes = {"run": {"seed": 3},
               "grpo": {"steps": 3, "micro_batch": 4, "lr": 1e-2},
               "rollout": {"mode": "async"}}
    steps, resumed_steps = 3, 5

    def run(self, runner: Any, config: TrainConfig, monkeypatch: Any) -> TrainResult:
        import trialbox.train.trainer as trainer_module
        # an untrained model fails every task, so every advantage would be 0 and nothing
        # would be trained: give the samples signal (alternating +1 / -1)
        monkeypatch.setattr(trainer_module, "group_advantages",
                            lambda r, v, kind: torch.where(torch.arange(r.numel()) % 2 == 0,
                                                           1.0, -1.0).view(r.shape))
        trained = []   # the policy versions of the trajectories, per update
        real_step = trainer_module.policy_step

        def spy(model: Any, opt: Any, trajs: Any, *a: Any, **kw: Any) -> Any:
            trained.append({t.policy_version for t in trajs})
            return real_step(model, opt, trajs, *a, **kw)
        monkeypatch.setattr(trainer_module, "policy_step", spy)
        # the model does one thing at a time (one generate call or update: the model slot)
        real_busy, most = pipeline.ModelClock.busy, [0]

        @contextmanager
        def busy(self: Any) -> Any:
            with real_busy(self):
                most[0] = max(most[0], self.inside)
                yield
        monkeypatch.setattr(pipeline.ModelClock, "busy", busy)
        result: TrainResult = runner.run(train(config, runner.pool), timeout=300)
        assert most == [1]
        assert trained == [{0}, {0}, {1}]
        return result

    def check_run(self, result: TrainResult, out: str) -> None:
        steps = step_lines(out)
        assert [x["policy_version"] for x in steps] == [0, 0, 1]
        assert [x["staleness"] for x in steps] == [0, 1, 1]
        for x in steps:
            assert x["trained_on"] == 4 and x["kind"] == "step"
            assert 0.0 <= x["policy_wait_share"] <= 1.0 and x["policy_wait_s"] >= 0.0
        assert weights_moved(out)

    def check_resumed(self, runner: Any, out: str, more: TrainConfig) -> None:
        steps = step_lines(out)
        assert [x["policy_version"] for x in steps][3:] == [3, 3]
        assert [x["staleness"] for x in steps][3:] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("variant", [Grpo(), Ppo(), Async()], ids=["grpo", "ppo", "async"])
def test_a_short_run_checkpoints_every_step_and_resumes(variant: Variant, runner, tmp_path,
                                                         monkeypatch):
    """Every way to train: the steps asked for, a metrics line and a checkpoint each,
    nothing left running; resumed with more steps, it goes on from the checkpoint to the
    new total, without a second SFT (and, GRPO's eval, without a second "before")."""
    out = str(tmp_path / "run")
    config = variant.config(out)
    result = variant.run(runner, config, monkeypatch)
    assert result.steps_done == variant.steps and not result.stopped
    steps = step_lines(out)
    assert [x["step"] for x in steps] == list(range(1, variant.steps + 1))
    for x in steps:
        assert x["episodes"] == 4 and x["gen_s"] > 0 and x["env_wall_s"] > 0
    state = json.load(open(os.path.join(out, "checkpoint", "state.json")))
    assert state["step"] == variant.steps
    variant.check_run(result, out)
    runner.assert_no_leaks()

    more = with_changes(config, run={"resume": True}, grpo={"steps": variant.resumed_steps})
    result = runner.run(train(more, runner.pool), timeout=300)
    assert result.steps_done == variant.resumed_steps
    assert [x["step"] for x in step_lines(out)] == list(range(1, variant.resumed_steps + 1))
    assert [x["kind"] for x in metrics(out)].count("sft") == 1
    variant.check_resumed(runner, out, more)


# ------------------------------------------------------------ kill -9, then resume

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_at_five_points_then_resume_equals_the_uninterrupted_run(runner, tmp_path,
                                                                        monkeypatch):
    seed = int(os.environ.get("TRIALBOX_CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    why = f"(kill points drawn with TRIALBOX_CRASH_SEED={seed})"

    # ---- the uninterrupted run (in this process), `tasks status` reading it live -------
    ref = str(tmp_path / "ref")
    config = config_from_dict(CONFIG | {"run": CONFIG["run"] | {"out_dir": ref}})
    db = os.path.join(ref, "journal.db")
    live: list[str] = []
    # `tasks status` reads the journal while the first judged turn is held: its task is
    # EXECUTING, the others of the step in flight
    import asyncio

    import trialbox.rollout.agent as agent_module
    real_judge = agent_module._judge
    held = [False]

    async def judge(env, task, completion, seed):
        if not held[0]:
            held[0] = True
            loop, looked = asyncio.get_running_loop(), asyncio.Event()

            def status() -> None:
                p = subprocess.run([sys.executable, "-m", "trialbox.cli", "tasks", "status",
                                    "--db", db], capture_output=True, text=True,
                                   cwd=ROOT, timeout=120)  # its only run: no run id
                live.append(p.stdout + p.stderr)
                loop.call_soon_threadsafe(looked.set)
            threading.Thread(target=status).start()
            await looked.wait()
        return await real_judge(env, task, completion, seed)
    monkeypatch.setattr(agent_module, "_judge", judge)
    threads = torch.get_num_threads()
    try:
        result = runner.run(train(config, runner.pool), timeout=300)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(agent_module, "_judge", real_judge)
    assert result.steps_done == 4
    [seen] = live
    assert "run ref: 4 tasks, 0 final" in seen and "  executing " in seen, seen
    expected = {episode_task_id(s, i, j, t.task_id)
                for s in range(4) for i, t in enumerate(train_tasks(config, s))
                for j in range(2)}
    finals = check_journal(db, "ref", expected)  # every move legal, one result each
    assert all(state == "done" for state, _ in finals.values())
    moves = sqlite3.connect(db).execute(
        "SELECT task_id, old, new FROM transitions WHERE run_id='ref'").fetchall()
    first = [(o, n) for t, o, n in moves if t == sorted(expected)[0]]
    assert first[:4] == [("", "pending"), ("pending", "queued"), ("queued", "generating"),
                         ("generating", "executing")], first
    assert first[-2:] == [("generating", "grading"), ("grading", "done")], first

    # ---- the same run, killed at five points, each resumed -----------------------------
    out = str(tmp_path / "crashed" / "ref")  # the run id is the directory's name
    os.makedirs(os.path.dirname(out))
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(toml(CONFIG))
    # the first kill comes when 1-3 of step 0's 4 episodes are finished: the others are
    # run again, in the batches of the uninterrupted run only thanks to `Episodes.replay`
    kills = [f"episode:{rng.randint(1, 3)}", f"time:{rng.uniform(0.02, 0.25):.2f}",
             f"grading:{rng.randint(1, 4)}", "update:1", f"update:{rng.randint(1, 2)}"]
    kept: dict = {}  # (task, attempt) -> trajectory journaled with a reward before a kill
    logs = tmp_path / "logs"
    logs.mkdir()
    with launcher(logs, ROOT) as run:  # each run a fresh process of its own
        for n, kill in enumerate([*kills, "none"]):
            rc, stdout, stderr = run(kill, [str(cfg_file), "--out", out]
                                     + (["--resume"] if n else []))
            if kill == "none":
                assert rc == 0, (why, stdout[-2000:], stderr[-3000:])
            else:
                assert rc == -9, (kill, why, rc, stderr[-3000:])
            results, trajs = journal_rows(os.path.join(out, "journal.db"))
            for key, tr in kept.items():  # what was finished is never run again
                assert trajs[key] == tr, (key, kill, why)
            kept |= {k: tr for k, tr in trajs.items() if tr["reward"] is not None}

        finals = check_journal(os.path.join(out, "journal.db"), "ref", expected)
        assert all(state == "done" for state, _ in finals.values()), (finals, why)
        # The records to equal: the same uninterrupted run in a fresh process, as the
        # crashed runs are. (The in-process run above shares the process's global state
        # with the tests that ran before it: in two fresh-clone `make test` runs its
        # records differed from the crashed-and-resumed run's while the same seeds passed
        # with this test alone — so it checks the journal and `tasks status`, not the
        # bits.)
        ref = str(tmp_path / "uninterrupted" / "ref")
        os.makedirs(os.path.dirname(ref))
        rc, stdout, stderr = run("none", [str(cfg_file), "--out", ref])
        assert rc == 0, (stdout[-2000:], stderr[-3000:])
    per_task: dict[str, int] = {}
    for task, _ in kept:
        per_task[task] = per_task.get(task, 0) + 1
    assert per_task == {t: 1 for t in expected}, why  # one rewarded trajectory each
    a, b = final_records(ref), final_records(out)
    assert a[0] == b[0], why          # every (step, episode): same final state and reward
    assert a[1] == b[1], why          # same token ids, masks, log-probs, turns
    assert a[2] == b[2], why          # same step records (timings aside)
    assert a[3].keys() == b[3].keys() and all(torch.equal(a[3][k], b[3][k]) for k in a[3])


@pytest.mark.slow
def test_bad_journals_and_nothing_to_resume_are_named_before_writing(runner, tmp_path):
    out = tmp_path / "run"
    base = config_from_dict(CONFIG | {"run": CONFIG["run"] | {"out_dir": str(out)},
                                      "grpo": CONFIG["grpo"] | {"steps": 1}})
    # --resume with nothing to resume: no checkpoint, nothing written
    with pytest.raises(UsageError, match="holds no checkpoint"):
        runner.run(train(with_changes(base, run={"resume": True}), runner.pool))
    assert not os.path.exists(out / "journal.db")
    torch_threads = torch.get_num_threads()
    try:
        runner.run(train(base, runner.pool), timeout=300)
    finally:
        torch.set_num_threads(torch_threads)
    db = out / "journal.db"

    def refused(config, match):
        before = (db.read_bytes(), (out / "metrics.jsonl").read_bytes())
        with pytest.raises(UsageError, match=match):
            runner.run(train(config, runner.pool))
        assert (db.read_bytes(), (out / "metrics.jsonl").read_bytes()) == before

    # a finished run: nothing to resume
    refused(with_changes(base, run={"resume": True}),
            r"nothing to resume.*raise \[grpo\] steps")
    more = with_changes(base, run={"resume": True}, grpo={"steps": 2})
    # another configuration (another seed: other episodes)
    refused(with_changes(more, run={"seed": 2}), "another configuration: seed differ")
    # another version of the journal's records
    con = sqlite3.connect(db)
    config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
    config["inputs"]["format"] = 0
    con.execute("UPDATE runs SET config=?", (json.dumps(config),))
    con.commit()
    con.close()
    refused(more, "another version of trialbox: format differ")
    # a journal written by another run, named explicitly
    other = tmp_path / "other.db"
    from trialbox.store.journal import Journal
    with Journal(str(other)) as j:
        j.add_run("someone-else", {"kind": "eval"})
    with pytest.raises(UsageError, match="has no run 'run' \\(its runs: someone-else\\)"):
        runner.run(train(with_changes(more, run={"journal": str(other)}), runner.pool))
    with Journal(str(other)) as j:
        j.add_run("run", {"kind": "eval"})
    with pytest.raises(UsageError, match="not a training run"):
        runner.run(train(with_changes(more, run={"journal": str(other)}), runner.pool))
    from trialbox.cli import main as cli_main
    assert cli_main(["tasks", "status", "--db", str(other)]) == 2  # two runs: name one
    # a fresh run on an explicit journal that already holds it
    with pytest.raises(UsageError, match="already holds run 'run'; pass --resume"):
        runner.run(train(with_changes(base, run={"journal": str(db)}), runner.pool))


def test_a_journaled_trajectory_reads_back_equal():
    """Every field of a trajectory survives the journal (a field added to `Trajectory`
    or `Turn` and not read back would make a resumed run's records differ)."""
    import asyncio

    from tests.rollout.test_agent_fake import CFG, RIGHT, SQUARE, WRONG, grader
    from trialbox.rollout.agent import rollout
    from trialbox.rollout.policy import ScriptedPolicy
    from trialbox.sandbox.fake import FakeProvider
    from trialbox.store.journal import dumps
    from trialbox.train.episodes import trajectory_from_json

    batch = asyncio.run(rollout(ScriptedPolicy([WRONG, RIGHT]), [SQUARE], config=CFG,
                                pool=FakeProvider(), grader=grader))
    [tr] = batch.trajectories
    back = trajectory_from_json(json.loads(dumps({"trajectory": tr}))["trajectory"])
    assert back == tr
