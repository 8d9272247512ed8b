"""`trialbox bench train`: single-turn GRPO throughput on the demo model, trialbox's trainer
(sync and async) side by side with TRL's `GRPOTrainer` in the same run, and the share of
the training loop's time the policy waited on environments.

    trialbox bench train [--json] [--out FILE] [--steps 4] [--prompts 8] [--group 4]
                         [--max-new-tokens 24] [--env-workers 4] [--threads 2]
                         [--sft-steps 100] [--seed 0] [--max-staleness 1] [--trl-first]

Work (identical for both systems): the demo model (trialbox/train/model.py, the byte-level
GPT-2 shape of demo.toml, built with the same seed, then a shared, untimed `--sft-steps`
supervised warm start so that some completions pass and both systems really update: from
an untrained model every reward is 0 and trialbox skips the update altogether); the demo
tasks of the training split, the same prompts in the same order (step s uses
`trainer.train_tasks(config, s)`); `--prompts` prompts × `--group` samples per step;
`--max-new-tokens` per completion at temperature 1; `--steps` optimizer steps, one
update epoch, no KL term; the binary reward of trialbox's trusted judge
(`judge_function`, real sandboxes, hidden tests) on every completion.

* ``trialbox`` — `trialbox.train.trainer.train()` itself (sft.steps = 0, eval.tasks = 0,
  rollout.max_turns = 1), sync mode: the agent loop generates a step's batch in one
  batched call, grades the completions concurrently (`--env-workers` at once) and
  updates; it also writes its metrics.jsonl, TensorBoard events and a checkpoint, as a
  real run does.
* ``trialbox_direct`` — the same sync run on the previous path (`[run] journal = "off"`:
  plain rollouts, `PrioritySlots` for the environment, no scheduler, no journal): what the
  journaled scheduler costs a training run (`sync/direct`, goal >= 0.97x). The sync run
  above is every episode a task of the journaled scheduler (train/episodes.py).
* ``trialbox_async`` — the same with `[rollout] mode = "async"`, `max_staleness =
  --max-staleness`: the next batches are generated while the current one is judged and
  the update runs (trialbox/train/pipeline.py); the batches in flight share the same
  `--env-workers` judge slots, so async adds overlap, not environment capacity.
* ``trl`` — `trl.GRPOTrainer` on CPU (`use_cpu`, no vLLM, `report_to="none"`, no saving):
  generation batch = one optimizer step = prompts × group. Its reward function grades the
  step's completions all at once through the same judge: TRL calls reward functions
  synchronously, so the judge runs in a private event loop on its own thread, with its own
  `CellPool` and `--env-workers` harness sessions. TRL needs a `PreTrainedTokenizerBase`:
  a `PreTrainedTokenizerFast` is built locally with `tokenizers` over the same byte ids
  (0..255, eos 256, pad 257); HF_HUB_OFFLINE=1, nothing is downloaded.

Differences that remain (stated, not hidden): trialbox stops a completion at its first
newline (the demo's `stop`), TRL at eos or the token budget; with an untrained model most
completions of both run to the budget, and tokens/s counts what each actually generated.
The judge grades TRL's completion cut at its first newline, as trialbox's would be.

Figures per system: wall time (setup included), episodes/s and generated tokens/s over
the wall time, median step time, the share of wall time in generation and in the
environment (judging; async batches overlap, so theirs can add up past the wall time),
and **policy wait**: the seconds of the training loop (first step's start to the last
step's end) in which the model neither generated nor trained, and their share of the
loop. trialbox: the loop's time minus the union of its generate calls and updates
(`pipeline.ModelClock`; its logging and checkpoints count as waiting, milliseconds).
TRL: the time inside its reward function (the judge; TRL generates, grades and updates
one after the other, so the model waits all of it). Ratio columns: sync / direct, async / sync,
sync / TRL and async / TRL (for times the inverse, so > 1 means the first is faster). `cpu_s`: the
trainer process's own CPU time (not the sandboxes'), steadier than wall time on a loaded
machine: what the scheduler and journal add shows there first.
Output: a table; with --json the results as one JSON object on the last line; --out FILE
writes it too. Exit 0 when every system ran and graded, 1 when one failed or graded
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import tempfile
import threading
import time
import warnings
from typing import Any

from trialbox.bench import report
from trialbox.errors import UsageError

SYSTEMS = ("trialbox", "trialbox_direct", "trialbox_async", "trl")
DEMO_TOML = os.path.join(os.path.dirname(__file__), "..", "train", "demo.toml")


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("train", help="single-turn GRPO episodes/s, tokens/s and policy "
                        "wait on the demo model: trialbox's trainer (sync, async) vs TRL's "
                        "GRPOTrainer")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per system (4)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (8)")
    p.add_argument("--group", type=int, default=4, help="samples per prompt (4)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens per completion (24)")
    p.add_argument("--env-workers", type=int, default=4, help="completions judged at once (4)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    p.add_argument("--seed", type=int, default=0, help="model and task seed (0)")
    p.add_argument("--sft-steps", type=int, default=100,
                   help="supervised warm start shared by both systems, not timed (100)")
    p.add_argument("--max-staleness", type=int, default=1,
                   help="trialbox_async: [rollout] max_staleness (1)")
    p.add_argument("--trl-first", action="store_true",
                   help="run the systems in reverse order: TRL first (to check the "
                   "order does not matter)")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def _config(args: argparse.Namespace, out_dir: str, model_path: str = "",
            asynchronous: bool = False, direct: bool = False) -> Any:
    from trialbox.train.config import load_config
    for name in ("steps", "prompts", "group", "max_new_tokens", "env_workers", "threads",
                 "max_staleness"):
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, "
                             f"got {value!r}")
    if isinstance(args.sft_steps, bool) or not isinstance(args.sft_steps, int) \
            or args.sft_steps < 0:
        raise UsageError(f"--sft-steps must be >= 0, got {args.sft_steps!r}")
    if args.group < 2:
        raise UsageError("--group must be >= 2 (GRPO normalises rewards within a group)")
    batch = args.prompts * args.group
    return load_config(DEMO_TOML, {
        "run": {"seed": args.seed, "out_dir": out_dir, "threads": args.threads,
                "checkpoint_every": args.steps, **({"journal": "off"} if direct else {})},
        "sft": {"steps": 0}, "eval": {"tasks": 0},
        "model": {"path": model_path} if model_path else {},
        "grpo": {"steps": args.steps, "tasks_per_step": args.prompts,
                 "group_size": args.group, "micro_batch": batch, "epochs": 1,
                 "kl_coef": 0.0},
        "rollout": {"max_turns": 1, "max_new_tokens": args.max_new_tokens,
                    "env_workers": args.env_workers, "temperature": 1.0,
                    **({"mode": "async", "max_staleness": args.max_staleness}
                       if asynchronous else {})}})


def warm_start(config: Any, steps: int, path: str) -> None:
    """The common starting point: the demo model after `steps` supervised steps (as the
    trainer's own warm start does), saved to `path`. Why: an untrained model never
    passes, every reward is 0, every advantage is 0 and trialbox skips the update
    (nothing to learn) while TRL still runs it; a warm start gives both real updates."""
    from trialbox.rollout.policy import ByteTokenizer
    from trialbox.train import demo_tasks
    from trialbox.train.config import with_changes
    from trialbox.train.model import build_model, save_model
    from trialbox.train.sft import sft
    tok = ByteTokenizer()
    model = build_model(config.model.shape, tok, seed=config.run.seed)
    seed = config.run.seed
    pairs = demo_tasks.sft_pairs(demo_tasks.make_tasks(
        demo_tasks.Split.TRAIN, max(2000, steps * config.sft.batch_size // 4),
        seed=seed + 7), seed=seed, retry_share=0.0)
    sft(model, tok, pairs, with_changes(config, sft={"steps": steps}).sft)
    save_model(model, tok, path)


# --------------------------------------------------------------------------- trialbox

def run_trialbox(config: Any) -> dict[str, Any]:
    from trialbox.train.trainer import train
    steps: list[dict[str, Any]] = []

    def progress(event: str, record: dict[str, Any]) -> None:
        if event in ("step", "skip"):
            steps.append(record)

    t0, cpu0 = time.monotonic(), time.process_time()
    result = asyncio.run(train(config, progress=progress))
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    episodes = sum(int(r["episodes"]) for r in steps)
    graded = episodes - sum(int(r["excluded"]) for r in steps)
    return _figures(wall=wall, episodes=episodes, graded=graded,
                    tokens=sum(int(r["model_tokens"]) for r in steps),
                    step_s=[float(r["step_s"]) for r in steps],
                    gen_s=sum(float(r["gen_s"]) for r in steps),
                    env_s=sum(float(r["env_wall_s"]) for r in steps),
                    mean_reward=_mean([float(r["reward"]) for r in steps]),
                    steps_done=result.steps_done,
                    loop_s=sum(float(r["lap_s"]) for r in steps),
                    wait_s=sum(float(r["policy_wait_s"]) for r in steps),
                    staleness=[int(r["staleness"]) for r in steps]) | {
                        "cpu_s": round(cpu, 3)}


# --------------------------------------------------------------------------- TRL

def byte_tokenizer_fast() -> Any:
    """A `PreTrainedTokenizerFast` with exactly the ids of trialbox's ByteTokenizer: byte b
    is id b, `<eos>` 256, `<pad>` 257 (GPT-2's byte-to-character map, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trialbox.rollout.policy import ByteTokenizer
    bt = ByteTokenizer()
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab["<eos>"] = bt.eos_id if bt.eos_id is not None else 256
    vocab["<pad>"] = bt.pad_id
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<eos>", "<pad>"])
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", padding_side="left")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


class _JudgeThread:
    """trialbox's judge for a synchronous caller: an event loop on its own thread with its
    own CellPool and `workers` reusable harness sessions."""

    def __init__(self, workers: int):
        from trialbox.judge.function import judge_pool_config
        from trialbox.sandbox.pool import CellPool
        self.workers = workers
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="bench-train-judge")
        self.thread.start()
        self.pool = self._call(CellPool(judge_pool_config(warm=2 * workers)).start())
        self.harnesses: list[Any] = []
        self.seconds = 0.0

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def grade(self, pairs: list[tuple[Any, str]]) -> list[float | None]:
        t0 = time.monotonic()
        out: list[float | None] = self._call(self._grade_all(pairs))
        self.seconds += time.monotonic() - t0
        return out

    async def _grade_all(self, pairs: list[tuple[Any, str]]) -> list[float | None]:
        from trialbox.errors import InfraError
        from trialbox.judge.function import judge_function, open_harness
        from trialbox.judge.reward import RewardSpec, reward
        slots = asyncio.Semaphore(self.workers)

        async def one(task: Any, completion: str) -> float | None:
            async with slots:
                try:
                    harness = self.harnesses.pop() if self.harnesses else \
                        await open_harness(self.pool)
                except InfraError:
                    return None
                try:
                    grade = await judge_function(task, completion, self.pool,
                                                 harness=harness)
                except InfraError:
                    return None
                finally:
                    self.harnesses.append(harness)
                return reward(grade, RewardSpec())

        return list(await asyncio.gather(*(one(t, c) for t, c in pairs)))

    def close(self) -> None:
        async def shut() -> None:
            for h in self.harnesses:
                await h.close()
            await self.pool.close()
        try:
            self._call(shut())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


def run_trl(config: Any, out_dir: str) -> dict[str, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from trialbox.rollout.policy import ByteTokenizer
    from trialbox.train.model import build_model, load_model
    from trialbox.train.trainer import train_tasks
    warnings.filterwarnings("ignore", category=FutureWarning)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    g, r = config.grpo, config.rollout
    t0 = time.monotonic()
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    tasks = [t for s in range(g.steps) for t in train_tasks(config, s)]
    data = Dataset.from_dict({"prompt": [t.prompt for t in tasks],
                              "task_index": list(range(len(tasks)))})
    tok = byte_tokenizer_fast()
    model = load_model(config.model.path)[0] if config.model.path else \
        build_model(config.model.shape, ByteTokenizer(), seed=config.run.seed)

    timing = {"gen_s": 0.0, "tokens": 0, "episodes": 0, "graded": 0}
    rewards: list[float] = []
    generate = model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:  # TRL calls the model's own generate
        t = time.monotonic()
        try:
            return generate(*a, **kw)
        finally:
            timing["gen_s"] += time.monotonic() - t

    model.generate = timed_generate
    judge = _JudgeThread(r.env_workers)

    def judge_reward(prompts: list[str], completions: list[str],
                     completion_ids: list[list[int]], task_index: list[int],
                     **_: Any) -> list[float | None]:
        timing["tokens"] += sum(len(ids) for ids in completion_ids)
        timing["episodes"] += len(completions)
        graded = judge.grade([(tasks[i], c.split("\n", 1)[0] + "\n")
                              for i, c in zip(task_index, completions, strict=True)])
        ok = [x for x in graded if x is not None]
        timing["graded"] += len(ok)
        rewards.extend(ok)
        return graded

    step_ends: list[float] = []

    class _Steps(TrainerCallback):
        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            if not step_ends:
                step_ends.append(time.monotonic())

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            step_ends.append(time.monotonic())

    batch = g.tasks_per_step * g.group_size
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, "trl"), use_cpu=True, bf16=False, fp16=False,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        max_steps=g.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=g.group_size, max_completion_length=r.max_new_tokens,
        temperature=r.temperature, top_p=1.0, top_k=0, learning_rate=g.lr,
        beta=0.0, num_iterations=1, epsilon=g.clip_eps_low, epsilon_high=g.clip_eps_high,
        max_grad_norm=g.max_grad_norm, shuffle_dataset=False, seed=config.run.seed,
        dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0)
    try:
        trainer = GRPOTrainer(model=model, reward_funcs=judge_reward, args=args,
                              train_dataset=data, processing_class=tok,
                              callbacks=[_Steps()])
        trainer.train()
        steps_done = int(trainer.state.global_step)
    finally:
        judge.close()
    wall = time.monotonic() - t0
    step_s = [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]
    return _figures(wall=wall, episodes=int(timing["episodes"]), graded=int(timing["graded"]),
                    tokens=int(timing["tokens"]), step_s=step_s, gen_s=float(timing["gen_s"]),
                    env_s=judge.seconds, mean_reward=_mean(rewards), steps_done=steps_done,
                    loop_s=step_ends[-1] - step_ends[0] if step_ends else 0.0,
                    wait_s=judge.seconds, staleness=[])


# --------------------------------------------------------------------------- report

def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _figures(*, wall: float, episodes: int, graded: int, tokens: int, step_s: list[float],
             gen_s: float, env_s: float, mean_reward: float | None,
             steps_done: int, loop_s: float, wait_s: float,
             staleness: list[int]) -> dict[str, Any]:
    return {"wall_s": round(wall, 3), "steps": steps_done, "episodes": episodes,
            "graded": graded, "tokens": tokens,
            "episodes_per_s": round(episodes / wall, 3) if wall > 0 else None,
            "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
            "median_step_s": round(statistics.median(step_s), 3) if step_s else None,
            "gen_s": round(gen_s, 3), "env_s": round(env_s, 3),
            "gen_share": round(gen_s / wall, 3) if wall > 0 else None,
            "env_share": round(env_s / wall, 3) if wall > 0 else None,
            "mean_reward": round(mean_reward, 3) if mean_reward is not None else None,
            "loop_s": round(loop_s, 3), "policy_wait_s": round(wait_s, 3),
            "policy_wait_share": round(wait_s / loop_s, 3) if loop_s > 0 else None,
            "max_staleness_seen": max(staleness) if staleness else None}


ROWS = [("wall_s", "wall time (s)", "time"), ("episodes_per_s", "episodes/s", "rate"),
        ("tokens_per_s", "generated tokens/s", "rate"),
        ("median_step_s", "median step (s)", "time"),
        ("cpu_s", "trainer process CPU (s)", "time"), ("episodes", "episodes", ""),
        ("tokens", "generated tokens", ""), ("graded", "graded by the judge", ""),
        ("gen_share", "share of wall: generation", ""),
        ("env_share", "share of wall: environment", ""),
        ("loop_s", "training loop (s)", "time"),
        ("policy_wait_s", "policy waited on env (s)", "time"),
        ("policy_wait_share", "share of loop: policy waited", ""),
        ("max_staleness_seen", "max staleness seen", ""),
        ("mean_reward", "mean reward", "")]
RATIOS = [("trialbox", "trialbox_direct", "sync/direct"),
          ("trialbox_async", "trialbox", "async/sync"), ("trialbox", "trl", "sync/trl"),
          ("trialbox_async", "trl", "async/trl")]


def ratio(a: Any, b: Any, kind: str) -> float | None:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not a or not b:
        return None
    return round(a / b if kind == "rate" else b / a, 2)


def table(results: dict[str, Any]) -> str:
    s = results["systems"]
    heads = ["sync", "direct", "async", "trl"] + [label for _, _, label in RATIOS]
    lines = [f"{'':30}" + "".join(f" {h:>10}" for h in heads)]
    for key, label, kind in ROWS:
        cells = [_cell(s[name].get(key)) for name in SYSTEMS]
        for a, b, _ in RATIOS:
            rt = ratio(s[a].get(key), s[b].get(key), kind) if kind else None
            cells.append(f"{rt:.2f}x" if rt is not None else "")
        lines.append(f"{label:30}" + "".join(f" {c:>10}" for c in cells))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="trialbox-bench-train-") as tmp:
        config = _config(args, os.path.join(tmp, "trialbox"))
        import torch
        torch.set_num_threads(args.threads)
        t0 = time.monotonic()
        if args.sft_steps:
            start = os.path.join(tmp, "start")
            warm_start(config, args.sft_steps, start)
            config = _config(args, os.path.join(tmp, "trialbox"), start)
        sft_s = time.monotonic() - t0
        results: dict[str, Any] = {
            "benchmark": "train", "machine": report.machine_info(),
            "work": {"steps": args.steps, "prompts": args.prompts, "group": args.group,
                     "max_staleness": args.max_staleness,
                     "max_new_tokens": args.max_new_tokens,
                     "env_workers": args.env_workers, "threads": args.threads,
                     "seed": args.seed, "sft_steps": args.sft_steps,
                     "sft_s": round(sft_s, 2), "trl_first": bool(args.trl_first)},
            "systems": {}}
        problems: list[str] = []
        configs = {"trialbox": config,
                   "trialbox_direct": _config(args, os.path.join(tmp, "trialbox_direct"),
                                              config.model.path, direct=True),
                   "trialbox_async": _config(args, os.path.join(tmp, "trialbox_async"),
                                             config.model.path, asynchronous=True)}
        for name in (tuple(reversed(SYSTEMS)) if args.trl_first else SYSTEMS):
            try:
                figs = run_trl(config, tmp) if name == "trl" else run_trialbox(configs[name])
            except (UsageError, KeyboardInterrupt):
                raise
            except Exception as e:  # a system that fails is reported, the other still runs
                problems.append(f"{name}: {type(e).__name__}: {e}")
                figs = {}
            results["systems"][name] = figs
            if figs and not figs.get("graded"):
                problems.append(f"{name}: no completion was graded by the judge")
        # The scheduler's cost is a few percent at most, less than the drift of a shared
        # machine between two runs minutes apart: a second pair in the reverse order
        # (direct, then sync: ABBA with the first) and the ratio is the geometric mean
        # of the two pairs', so a drift that favours whichever runs first or later cancels.
        again: dict[str, Any] = {}
        for name in ("trialbox_direct", "trialbox"):
            try:
                again[name] = run_trialbox(_config(
                    args, os.path.join(tmp, name + "_again"), config.model.path,
                    direct=name == "trialbox_direct"))
            except (UsageError, KeyboardInterrupt):
                raise
            except Exception as e:
                problems.append(f"{name} (second pair): {type(e).__name__}: {e}")
                again[name] = {}
        results["systems_second_pair"] = again
    s = results["systems"]
    results["ratio_episodes_per_s"] = ratio(s["trialbox"].get("episodes_per_s"),
                                            s["trl"].get("episodes_per_s"), "rate")
    results["ratio_async_sync_episodes_per_s"] = ratio(
        s["trialbox_async"].get("episodes_per_s"), s["trialbox"].get("episodes_per_s"),
        "rate")
    results["ratio_async_trl_episodes_per_s"] = ratio(
        s["trialbox_async"].get("episodes_per_s"), s["trl"].get("episodes_per_s"), "rate")
    def exact(a: Any, b: Any) -> float | None:  # unrounded: the goal is 0.97
        ok = all(isinstance(v, (int, float)) and v > 0 for v in (a, b))
        return a / b if ok else None
    pairs = [exact(x["trialbox"].get("episodes_per_s"),
                   x["trialbox_direct"].get("episodes_per_s"))
             for x in (s, results["systems_second_pair"])]
    results["ratio_sync_direct_pairs"] = [round(p, 3) if p is not None else None
                                          for p in pairs]
    results["ratio_sync_direct_episodes_per_s"] = (
        round(math.sqrt(pairs[0] * pairs[1]), 3)
        if pairs[0] is not None and pairs[1] is not None else None)
    cpu = [exact(x["trialbox_direct"].get("cpu_s"), x["trialbox"].get("cpu_s"))
           for x in (s, results["systems_second_pair"])]
    results["ratio_sync_direct_cpu"] = (round(math.sqrt(cpu[0] * cpu[1]), 3)
                                        if cpu[0] is not None and cpu[1] is not None
                                        else None)
    results["goal"] = ("trialbox episodes/s >= 1.0x TRL; the scheduler path >= 0.97x the "
                       "previous (direct) path")
    results["problems"] = problems
    pair_line = (f"scheduler path / direct path, episodes/s: pairs "
                 f"{' and '.join(f'{p:.3f}x' if p is not None else '-' for p in pairs)} "
                 f"(sync first, then direct first), geometric mean "
                 f"{_cell(results['ratio_sync_direct_episodes_per_s'])}x (goal >= 0.97x); "
                 f"trainer CPU {_cell(results['ratio_sync_direct_cpu'])}x")
    report.emit(results, args, "\n".join([table(results), pair_line]
                                          + [f"problem: {p}" for p in problems]))
    return 1 if problems else 0
