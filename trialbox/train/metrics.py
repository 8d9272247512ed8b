"""What a training run reports as it goes: its progress events (`Progress`) and each
step's record (`StepRecord`, one line of metrics.jsonl), written by `log_step` to
metrics.jsonl, TensorBoard, the telemetry and the progress callback.

    record = step_record(got, upd, t0=t0, t_rollout=..., t_update=..., lap=clock.lap(),
                         ppo=False)
    state, stopped = log_step(state, record, skipped=upd.skipped, ...)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from trialbox import telemetry
from trialbox.train.config import GRPOConfig
from trialbox.train.pipeline import StepBatch
from trialbox.train.runfiles import MetricsLog
from trialbox.train.update import UpdateStats
from trialbox.types import Outcome, StepSummary, TrainState

Progress = Callable[[str, dict[str, Any]], None]
"""(event, record): "sft" (every few SFT steps), "eval", "step", "skip", "stop",
"episodes" (the journal, and how many episodes were run now or read back from it)."""


@dataclass(frozen=True)
class StepRecord:
    """One line of metrics.jsonl for a step (kind "step", or "skip" when its loss was
    not finite). The line's keys are the fields, in this order; `value_loss` and
    `skipped` only when set."""

    reward: float
    """Mean reward over the step's graded episodes."""
    pass_rate: float
    pass_turn1: float
    """Share of graded episodes that passed at their first turn."""
    excluded: int
    episodes: int
    turns: int
    trained_on: int
    loss: float
    kl: float
    clip_frac: float
    grad_norm: float
    replayed: int
    replay_nll: float
    gen_s: float
    env_wall_s: float
    rollout_s: float
    """How long the step waited for its batch (sync: the whole rollout)."""
    update_s: float
    model_tokens: int
    episodes_per_s: float
    tokens_per_s: float
    step_s: float
    policy_version: int
    staleness: int
    lap_s: float
    """Wall time since the previous step's record (its logging and checkpoint included)."""
    policy_wait_s: float
    """How much of `lap_s` the model neither generated nor trained (it waited on
    environments)."""
    policy_wait_share: float
    value_loss: float | None = None
    """PPO's value loss (None for GRPO: no key)."""
    skipped: str | None = None
    """Why the step changed nothing ("non-finite loss"; None: it trained, no key)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("value_loss", "skipped"):
            if out[key] is None:
                del out[key]
        return out


def step_record(got: StepBatch, upd: UpdateStats, *, t0: float, t_rollout: float,
                t_update: float, lap: tuple[float, float], ppo: bool) -> StepRecord:
    """A step's record from its batch and its update; `lap` is `ModelClock.lap()`:
    (wall time since the last lap, how much of it the model waited)."""
    trajs, s = got.batch.trajectories, got.batch.stats
    graded = [t for t in trajs if t.reward is not None]
    first = [t for t in graded if t.turns and t.turns[0].outcome is Outcome.PASSED]
    elapsed = max(1e-9, time.monotonic() - t0)
    lap_s, wait_s = lap
    return StepRecord(
        reward=sum(t.reward for t in graded if t.reward is not None) / max(1, len(graded)),
        pass_rate=sum(t.passed for t in graded) / max(1, len(graded)),
        pass_turn1=len(first) / max(1, len(graded)),
        excluded=s.excluded, episodes=s.episodes, turns=s.turns,
        trained_on=upd.trained_on, loss=upd.loss, kl=upd.kl,
        clip_frac=upd.clip_frac, grad_norm=upd.grad_norm,
        replayed=upd.replayed, replay_nll=upd.replay_nll,
        gen_s=s.gen_s, env_wall_s=s.env_wall_s, rollout_s=t_rollout,
        update_s=t_update, model_tokens=s.model_tokens,
        episodes_per_s=s.episodes / elapsed, tokens_per_s=s.model_tokens / elapsed,
        step_s=elapsed, policy_version=got.version, staleness=got.staleness,
        lap_s=lap_s, policy_wait_s=wait_s,
        policy_wait_share=wait_s / max(1e-9, lap_s),
        value_loss=upd.value_loss if ppo else None)


def log_step(state: TrainState, record: StepRecord, *, skipped: bool, log: MetricsLog,
             say: Progress, run_id: str, g: GRPOConfig) -> tuple[TrainState, str]:
    """Step `state.step + 1`'s record, everywhere it goes; the state after the step and
    why the run stops now ("" to go on). A step whose loss was not finite changed no
    weight and is logged as a skip; `max_bad_steps` of them in a row stop the run, and
    the step that stops it enters no history."""
    step = state.step + 1
    state = replace(state, step=step)
    scalars = {k: float(v) for k in ("pass_rate", "loss", "kl")
               if isinstance(v := getattr(record, k), (int, float)) and math.isfinite(v)}
    telemetry.record_train_step(run_id, step, reward_mean=record.reward, **scalars)
    if skipped:
        state = replace(state, bad_in_a_row=state.bad_in_a_row + 1)
        record = replace(record, skipped="non-finite loss")
        log.write("skip", step, record.to_dict())
        say("skip", {"step": step, **record.to_dict()})
        if state.bad_in_a_row >= g.max_bad_steps:
            stopped = (f"{state.bad_in_a_row} steps in a row had a non-finite loss "
                       f"(max_bad_steps = {g.max_bad_steps})")
            say("stop", {"reason": stopped})
            return state, stopped
    else:
        state = replace(state, bad_in_a_row=0)
        log.write("step", step, record.to_dict())
        say("step", {"step": step, "steps": g.steps, **record.to_dict()})
    return replace(state, history=(*state.history, StepSummary(
        step, record.reward, record.pass_rate, record.pass_turn1))), ""
