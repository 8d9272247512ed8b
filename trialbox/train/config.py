"""The training run's configuration: one dataclass per component, read from TOML.

    [run]     seed, out_dir, device, threads, resume, checkpoint_every, journal
    [model]   path (a saved model) or the shape of a fresh one (n_layer, n_embd, …)
    [sft]     the supervised warm start (steps = 0 skips it)
    [grpo]    the policy-gradient phase (algorithm = "grpo" or "ppo")
    [rollout] the agent loop (turns, tokens, temperature, concurrency; mode = "async")
    [eval]    pass@1 before and after, on the validation or the test split
    [tasks]   where tasks come from (the demo family, HumanEval, JSONL/Parquet files or
              fsspec URLs) and the train / validation / test splits (tasksets.py)
    [policy]  the local model of [model] (trained), or an OpenAI-compatible server
              (vLLM, SGLang: rollouts and evaluation only, docs/training.md)

    config = load_config("trialbox/train/demo.toml")   # = trialbox train <that file>

Every problem is a UsageError naming the field to change: an unknown section or key
(a typo must not silently fall back to a default), a wrong type, a size that does not
fit another (prompt + turns beyond the model's positions, a micro-batch that does not
divide the batch).
"""

from __future__ import annotations

import enum
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from trialbox.errors import UsageError
from trialbox.train.settings import Advantage, Aggregation, ModelConfig, SFTConfig
from trialbox.train.tasksets import EvalSplit, TasksSection, check_tasks_table


@dataclass(frozen=True)
class RunConfig:
    """Where and how the run happens."""

    seed: int = 0
    """Seeds the model's initialisation, the task stream and sampling."""
    out_dir: str = "runs/train"
    """Checkpoints, metrics.jsonl, TensorBoard events, the reward curve."""
    device: str = "cpu"
    """`cpu`, `cuda` or `cuda:N` (an error when CUDA is asked for but absent)."""
    threads: int = 0
    """torch CPU threads (0: leave torch's default)."""
    resume: bool = False
    """Continue from the latest checkpoint in out_dir (an error when there is none)."""
    checkpoint_every: int = 10
    """GRPO steps between checkpoints (the last step is always saved)."""
    journal: str = ""
    """The scheduler's journal (SQLite) in which every episode of every step is a task
    with all its transitions and its trajectory; empty: out_dir/journal.db. "off": the
    previous path (no scheduler, no journal, no resume inside a step), kept so
    `bench train` can compare the two."""


@dataclass(frozen=True)
class ModelSection:
    """The policy: a saved model (`path`) or a fresh one of the given shape."""

    path: str = ""
    """A directory written by save_model / a checkpoint; empty: build from `shape`."""
    shape: ModelConfig = field(default_factory=ModelConfig)


class Algorithm(enum.Enum):
    """Where the policy gradient's advantages come from."""

    GRPO = "grpo"
    """One advantage per episode, normalised within its task's group (no critic)."""
    PPO = "ppo"
    """Per-token GAE advantages from a learned value head (`ppo.ValueHead`), plus
    `value_coef` x the clipped value loss."""


PPO_ONLY = ("value_coef", "value_clip", "gamma", "lam")
"""[grpo] keys that only mean something with algorithm = "ppo"."""
GRPO_ONLY = ("advantage", "replay", "replay_coef", "replay_capacity")
"""[grpo] keys that only mean something with algorithm = "grpo" (PPO's advantages come
from GAE; its update takes no replayed answers)."""


@dataclass(frozen=True)
class GRPOConfig:
    """The policy-gradient phase (GRPO / Dr. GRPO, or PPO, over multi-turn episodes)."""

    algorithm: Algorithm = Algorithm.GRPO
    """grpo (group advantages) or ppo (value head + GAE)."""
    steps: int = 30
    """Rollout + update rounds."""
    tasks_per_step: int = 16
    """Distinct tasks per round."""
    group_size: int = 8
    """Episodes per task; advantages are normalised within each task's group."""
    lr: float = 2e-4
    """AdamW learning rate (constant)."""
    epochs: int = 1
    """Passes over each round's trajectories (>1 makes the ratio clip matter)."""
    micro_batch: int = 32
    """Trajectories per forward/backward (gradients accumulate over the round)."""
    clip_eps_low: float = 0.2
    """Ratio clip below 1."""
    clip_eps_high: float = 0.28
    """Ratio clip above 1 (DAPO's clip-higher keeps exploration alive)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the frozen starting policy (0: no reference)."""
    advantage: Advantage = Advantage.GRPO
    """GRPO (std-normalised) or DR_GRPO (centred only)."""
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    """token_mean, seq_mean or seq_sum (Dr. GRPO)."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    max_bad_steps: int = 3
    """Non-finite losses in a row before the run stops (each one is skipped)."""
    value_coef: float = 0.5
    """PPO: weight of the clipped value loss next to the policy loss."""
    value_clip: float = 0.2
    """PPO: how far a value may move from its rollout-time estimate before its loss
    stops pulling it (PPO2's value clip)."""
    gamma: float = 1.0
    """PPO: discount per model token (1: the episode's reward counts in full)."""
    lam: float = 0.95
    """PPO: the GAE lambda (1: Monte-Carlo returns, 0: one-step TD)."""
    replay: int = 0
    """Self-imitation: judge-passed first-turn answers of earlier steps added to each
    GRPO update as a likelihood term (trialbox/train/replay.py); 0 = off."""
    replay_coef: float = 0.1
    """Weight of the replayed answers' mean NLL per token next to the policy loss."""
    replay_capacity: int = 512
    """Distinct (task, answer) pairs the replay buffer keeps (first in, first out)."""

    def __post_init__(self) -> None:
        for name in ("tasks_per_step", "group_size", "epochs", "micro_batch",
                     "max_bad_steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"[grpo] {name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 0:
            raise UsageError(f"[grpo] steps must be >= 0, got {self.steps}")
        if self.group_size < 2 and self.algorithm is Algorithm.GRPO:
            raise UsageError("[grpo] group_size must be >= 2: a group of one has no "
                             "baseline, so every advantage would be 0")
        if not self.lr > 0 or not self.max_grad_norm > 0:
            raise UsageError("[grpo] lr and max_grad_norm must be > 0")
        if not (0 < self.clip_eps_low < 1 and self.clip_eps_high > 0):
            raise UsageError("[grpo] clip_eps_low must be in (0, 1), clip_eps_high > 0")
        if self.kl_coef < 0:
            raise UsageError(f"[grpo] kl_coef must be >= 0, got {self.kl_coef}")
        if not self.value_coef > 0 or not self.value_clip > 0:
            raise UsageError("[grpo] value_coef and value_clip must be > 0")
        if self.replay < 0 or self.replay_capacity < 1 or self.replay_coef < 0:
            raise UsageError("[grpo] replay must be >= 0, replay_capacity >= 1 and "
                             "replay_coef >= 0")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"[grpo] {name} must be in [0, 1], got "
                                 f"{getattr(self, name)}")

    @property
    def batch(self) -> int:
        """Trajectories per round."""
        return self.tasks_per_step * self.group_size


class RewardKind(enum.Enum):
    """How the judge's grade becomes the training reward."""

    BINARY = "binary"
    """1 for a pass (every hidden and visible test), else 0."""
    PASS_RATE = "pass_rate"
    """Partial credit: 0.5 x the fraction of tests passed + 0.5 for passing them all."""


class RolloutMode(enum.Enum):
    """How a step's batch is produced relative to the update (trialbox/train/pipeline.py)."""

    SYNC = "sync"
    """Roll out the step's batch with the current weights, then update: on-policy, and
    the model waits while the batch's episodes are executed and judged."""
    ASYNC = "async"
    """A producer rolls out the next batches while the current one is still being judged
    and while the update runs; each batch is generated by a snapshot of the weights at
    most `max_staleness` updates older than the weights it trains."""


@dataclass(frozen=True)
class RolloutSection:
    """The agent loop during training."""

    max_turns: int = 2
    """Model turns per episode (feedback from the visible tests between turns)."""
    max_new_tokens: int = 24
    """Tokens per turn."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (log-probs are recomputed at it)."""
    turn_penalty: float = 0.5
    """Reward lost per extra turn: a first-turn pass is worth more."""
    env_workers: int = 4
    """Turns judged at once."""
    reward: RewardKind = RewardKind.BINARY
    """binary or pass_rate (partial credit from the judge's per-test evidence)."""
    mode: RolloutMode = RolloutMode.SYNC
    """sync (roll out, then update) or async (the next batches are rolled out while the
    current one is judged and trained on)."""
    max_staleness: int = 1
    """async: how many updates older than the trained weights a batch's sampling
    weights may be (the producer waits rather than run further ahead; >= 1)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_staleness, bool) or self.max_staleness < 1:
            raise UsageError(f"[rollout] max_staleness must be >= 1, got "
                             f"{self.max_staleness!r} (a batch 0 updates stale is "
                             "mode = 'sync')")


@dataclass(frozen=True)
class EvalSection:
    """pass@1 on a split never trained on (the real judge), with a 95% interval."""

    tasks: int = 200
    """Tasks of the split at most (0: no evaluation)."""
    temperature: float = 0.0
    """0: greedy, one sample per task (pass@1 of the model's best answer)."""
    split: EvalSplit = EvalSplit.TEST
    """test (the reported figure) or validation (what a recipe is tuned on)."""

    def __post_init__(self) -> None:
        if self.tasks < 0:
            raise UsageError(f"[eval] tasks must be >= 0, got {self.tasks}")


class PolicyKind(enum.Enum):
    """Which model writes the episodes."""

    LOCAL = "local"
    """The [model] section's transformers model, in this process: sampled and trained."""
    OPENAI = "openai"
    """A model served by an OpenAI-compatible server (vLLM, SGLang) at `base_url`:
    trialbox cannot update its weights yet, so the run evaluates only ([sft] and
    [grpo] steps = 0; docs/training.md, "A served model")."""


SERVER_KEYS = ("base_url", "model", "tokenizer", "api_key_env", "prompt_as",
               "max_concurrency", "timeout_s")
"""[policy] keys that only mean something with kind = "openai"."""


@dataclass(frozen=True)
class PolicySection:
    """The model that writes the episodes."""

    kind: PolicyKind = PolicyKind.LOCAL
    """local ([model], trained) or openai (a served model, evaluation only)."""
    base_url: str = ""
    """openai: the server, e.g. http://localhost:8000/v1."""
    model: str = ""
    """openai: the served model's name (vLLM's --served-model-name)."""
    tokenizer: str = "byte"
    """openai: the served model's tokenizer: "byte" (the demo model's) or a local
    directory holding a transformers tokenizer (never downloaded)."""
    api_key_env: str = ""
    """openai: the environment variable holding the API key ("" = none; never the key
    itself in a config file)."""
    prompt_as: str = "text"
    """openai: send the prompt as "text" or as token "ids"."""
    max_concurrency: int = 64
    """openai: requests in flight at once."""
    timeout_s: float = 120.0
    """openai: one request's timeout."""

    def __post_init__(self) -> None:
        if self.kind is PolicyKind.OPENAI:
            if not self.base_url.startswith(("http://", "https://")):
                raise UsageError(f"[policy] base_url must start with http:// or https:// "
                                 f"(e.g. http://localhost:8000/v1), got {self.base_url!r}")
            if not self.model:
                raise UsageError("[policy] model must name the served model (vLLM's "
                                 "--served-model-name)")
            if self.prompt_as not in ("text", "ids"):
                raise UsageError(f"[policy] prompt_as must be 'text' or 'ids', got "
                                 f"{self.prompt_as!r}")
            if self.max_concurrency < 1 or not self.timeout_s > 0:
                raise UsageError("[policy] max_concurrency must be >= 1 and timeout_s > 0")


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelSection = field(default_factory=ModelSection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    eval: EvalSection = field(default_factory=EvalSection)
    tasks: TasksSection = field(default_factory=TasksSection)
    policy: PolicySection = field(default_factory=PolicySection)

    def __post_init__(self) -> None:
        if self.policy.kind is PolicyKind.OPENAI:
            if self.sft.steps or self.grpo.steps or self.run.resume:
                raise UsageError(
                    "[policy] kind = 'openai': trialbox cannot update a served model's "
                    "weights yet, so set [sft] steps = 0 and [grpo] steps = 0 (and no "
                    "resume) to evaluate it, or use kind = 'local' to train the [model] "
                    "copy (docs/training.md, \"A served model\")")
            if not self.eval.tasks:
                raise UsageError("[policy] kind = 'openai' evaluates only, but [eval] "
                                 "tasks = 0; set [eval] tasks")
        if self.grpo.batch % self.grpo.micro_batch and self.grpo.micro_batch < self.grpo.batch:
            raise UsageError(
                f"[grpo] micro_batch={self.grpo.micro_batch} must divide tasks_per_step x "
                f"group_size = {self.grpo.batch}; change micro_batch")
        # The longest demo prompt is ~110 bytes; each turn adds its output and ~40 bytes
        # of feedback. It must fit the model's learned positions.
        need = 120 + self.rollout.max_turns * (self.rollout.max_new_tokens + 40)
        positions = self.model.shape.n_positions
        if self.tasks.demo and not self.model.path and need > positions:
            raise UsageError(
                f"[rollout] max_turns={self.rollout.max_turns} x max_new_tokens="
                f"{self.rollout.max_new_tokens} needs ~{need} positions but [model] "
                f"n_positions={positions}; raise n_positions or lower them")
        if self.rollout.max_turns < 1 or self.rollout.max_new_tokens < 1 \
                or self.rollout.env_workers < 1:
            raise UsageError("[rollout] max_turns, max_new_tokens and env_workers must be "
                             ">= 1")
        if self.run.checkpoint_every < 1:
            raise UsageError("[run] checkpoint_every must be >= 1")

    @property
    def positions(self) -> int:
        return self.model.shape.n_positions


T = TypeVar("T")


def _section(cls: type[T], table: Any, where: str) -> T:
    if not isinstance(table, dict):
        raise UsageError(f"[{where}] must be a table")
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise UsageError(f"[{where}] unknown key {key!r}; known keys: "
                             f"{', '.join(sorted(known))}")
        default = getattr(cls(), key)
        values[key] = _coerce(value, default, f"[{where}] {key}")
    try:
        return cls(**values)
    except TypeError as e:
        raise UsageError(f"[{where}]: {e}") from e


def _coerce(value: Any, default: Any, where: str) -> Any:
    if isinstance(default, enum.Enum):
        choices = [m.value for m in type(default)]
        if value not in choices:
            raise UsageError(f"{where} = {value!r}: use one of {', '.join(choices)}")
        return type(default)(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{where} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise UsageError(f"{where} must be a string, got {value!r}")
        return value
    raise UsageError(f"{where}: unsupported value {value!r}")


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from parsed TOML (see the module docstring for the sections)."""
    sections = {"run", "model", "sft", "grpo", "rollout", "eval", "tasks", "policy"}
    for key in data:
        if key not in sections:
            raise UsageError(f"unknown section [{key}]; known sections: "
                             f"{', '.join(sorted(sections))}")
    _check_algorithm_keys(data.get("grpo", {}))
    _check_mode_keys(data.get("rollout", {}))
    _check_policy_keys(data.get("policy", {}))
    check_tasks_table(data.get("tasks", {}))
    tasks_table = data.get("tasks", {})
    if isinstance(tasks_table, dict) and "source" not in tasks_table and any(
            tasks_table.get(k) for k in ("train", "validation", "test")):
        tasks_table = {**tasks_table, "source": ""}  # named files: no source
    model_table = dict(data.get("model", {}))
    path = model_table.pop("path", "")
    if not isinstance(path, str):
        raise UsageError("[model] path must be a string")
    if path and not os.path.isdir(path):
        raise UsageError(f"[model] path {path!r} does not exist or is not a directory; "
                         "give a directory written by save_model, or remove path to build "
                         "a fresh model")
    try:
        return TrainConfig(
            run=_section(RunConfig, data.get("run", {}), "run"),
            model=ModelSection(path=path, shape=_section(ModelConfig, model_table, "model")),
            sft=_section(SFTConfig, data.get("sft", {}), "sft"),
            grpo=_section(GRPOConfig, data.get("grpo", {}), "grpo"),
            rollout=_section(RolloutSection, data.get("rollout", {}), "rollout"),
            eval=_section(EvalSection, data.get("eval", {}), "eval"),
            tasks=_section(TasksSection, tasks_table, "tasks"),
            policy=_section(PolicySection, data.get("policy", {}), "policy"))
    except UsageError as e:
        msg = str(e)
        if msg.startswith("model."):
            msg = "[model] " + msg[len("model."):]
        elif msg.startswith("sft."):
            msg = "[sft] " + msg[len("sft."):]
        raise UsageError(msg) from e


def _check_algorithm_keys(table: Any) -> None:
    """A key that the chosen algorithm ignores is a mistake, not a no-op: PPO's keys
    under GRPO, or GRPO's group `advantage` under PPO (PPO's advantages are GAE's)."""
    if not isinstance(table, dict):
        return  # _section reports it
    algorithm = table.get("algorithm", Algorithm.GRPO.value)
    if algorithm not in [a.value for a in Algorithm]:
        return  # _section reports it, with the choices
    ppo = algorithm == Algorithm.PPO.value
    if ppo:
        for key in GRPO_ONLY:
            if key in table:
                raise UsageError(f"[grpo] {key} only applies to algorithm = 'grpo' (PPO's "
                                 "advantages come from GAE, and its update takes no "
                                 f"replayed answers); remove {key} or set "
                                 "algorithm = 'grpo'")
    if not ppo:
        for key in PPO_ONLY:
            if key in table:
                raise UsageError(f"[grpo] {key} only applies to algorithm = 'ppo'; "
                                 f"remove {key} or set algorithm = 'ppo'")


def _check_policy_keys(table: Any) -> None:
    """A server's keys under kind = "local" are a mistake (a forgotten kind), not a no-op."""
    if not isinstance(table, dict):
        return  # _section reports it
    if table.get("kind", PolicyKind.LOCAL.value) == PolicyKind.LOCAL.value:
        for key in SERVER_KEYS:
            if key in table:
                raise UsageError(f"[policy] {key} only applies to kind = 'openai' (a "
                                 f"served model); set kind = 'openai' or remove {key}")


def _check_mode_keys(table: Any) -> None:
    """`max_staleness` means something only in async mode: under sync it is a mistake
    (e.g. a forgotten `mode = "async"`), not a no-op."""
    if not isinstance(table, dict):
        return  # _section reports it
    if "max_staleness" in table and table.get("mode", RolloutMode.SYNC.value) == \
            RolloutMode.SYNC.value:
        raise UsageError("[rollout] max_staleness only applies to mode = 'async'; set "
                         "mode = 'async' or remove max_staleness")


def load_config(path: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a TOML file; `overrides` ({"run": {"seed": 3}}) are merged over it."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise UsageError(f"config file {path!r} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from e
    for section, values in (overrides or {}).items():
        data[section] = {**data.get(section, {}), **values}
    return config_from_dict(data)


def with_changes(config: TrainConfig, **sections: dict[str, Any]) -> TrainConfig:
    """A copy with fields of some sections changed: with_changes(c, grpo={"steps": 2})."""
    out = config
    for name, changes in sections.items():
        out = replace(out, **{name: replace(getattr(out, name), **changes)})
    return out
