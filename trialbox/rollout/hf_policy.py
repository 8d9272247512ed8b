"""`HFPolicy`: a local Hugging Face `transformers` causal LM as a `Policy`.

    policy = HFPolicy.from_pretrained("/models/qwen2.5-0.5b", device="cuda")  # local only
    policy = HFPolicy(model, ByteTokenizer())        # any PreTrainedModel + tokenizer
    gens = await policy.generate([ids1, ids2], max_new_tokens=128, temperature=0.8,
                                 stop=None)

Sampling is our own loop over the model's forward (KV cache, left-padded batch,
attention mask, explicit position ids), not `model.generate`, so that the log-prob of
every sampled token is exactly `log_softmax(logits / temperature)[token]` — the
distribution the token was drawn from — which is what a policy-gradient ratio needs.
(`generate`'s scores go through its logits processors; what they contain depends on
the generation config.) Temperature 0 is greedy, with log-probs of the untempered
distribution. The loop runs in a worker thread (`asyncio.to_thread`) so the event loop
keeps driving sandboxes while the model thinks; calls are serialised by a lock.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Sequence
from typing import Any

import torch

from trialbox.errors import UsageError
from trialbox.rollout.policy import (
    Generation,
    Tokenizer,
    as_tokenizer,
    check_generate_args,
    stop_at,
)


def check_device(device: str) -> torch.device:
    """A torch device for "cpu", "cuda" or "cuda:N"; a clear error when it is absent."""
    if not isinstance(device, str) or not (device == "cpu" or device == "cuda"
                                           or device.startswith("cuda:")):
        raise UsageError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r}: no CUDA device is available here; use "
                         "device='cpu'")
    return torch.device(device)


class HFPolicy:
    """A local causal LM. The model object is shared, not copied: a trainer that updates
    it in place is sampled from on the next call. During a call the model is put in
    eval mode (no dropout) and its previous mode restored afterwards."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str | None = None,
                 seed: int | None = None):
        if not callable(model) or not hasattr(model, "parameters"):
            raise UsageError(f"HFPolicy: model must be a transformers PreTrainedModel (a "
                             f"torch module), got {type(model).__name__}")
        self.model = model
        self.tokenizer: Tokenizer = as_tokenizer(tokenizer)
        self.device = check_device(device) if device is not None \
            else next(model.parameters()).device
        if device is not None:
            self.model.to(self.device)
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        self._lock = asyncio.Lock()
        cfg = getattr(model, "config", None)
        self.max_positions: int | None = (getattr(cfg, "max_position_embeddings", None)
                                          or getattr(cfg, "n_positions", None))
        self.calls = 0
        # transformers ≥ 5.x names the KV cache argument `cache`; earlier, `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(cls, path: str, *, tokenizer: Any = None, device: str = "cpu",
                        seed: int | None = None, dtype: torch.dtype | None = None) -> HFPolicy:
        """Load a model saved with `save_pretrained` from a local directory — never a
        download (`local_files_only`). The tokenizer is loaded from the same directory
        unless one is given (e.g. a `ByteTokenizer`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
            raise UsageError(f"model path {str(path)!r} does not exist or is not a "
                             "directory; give a local directory written by save_pretrained")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise UsageError(f"model path {str(path)!r} has no config.json; give a "
                             "directory written by save_pretrained")
        dev = check_device(device)
        if tokenizer is None:
            try:
                tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            except (OSError, ValueError) as e:
                raise UsageError(f"no tokenizer could be loaded from {str(path)!r} ({e}); "
                                 "pass tokenizer=") from e
        kwargs: dict[str, Any] = {"local_files_only": True}
        if dtype is not None:  # transformers < 4.56 calls it torch_dtype
            import transformers
            from packaging.version import Version
            old = Version(transformers.__version__) < Version("4.56")
            kwargs["torch_dtype" if old else "dtype"] = dtype
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        return cls(model, tokenizer, device=str(dev), seed=seed)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, *, device: str = "cpu",
                    seed: int | None = None) -> HFPolicy:
        """A randomly initialised model built from a `transformers` config (tests, the
        demo's tiny model). `seed` also seeds the initialisation."""
        from transformers import AutoModelForCausalLM

        if seed is not None:
            torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        return cls(model, tokenizer, device=device, seed=seed)

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float = 1.0,
                       stop: list[str] | None = None) -> list[Generation]:
        self._check(prompts, max_new_tokens, temperature, stop)
        if not prompts:
            return []
        async with self._lock:
            self.calls += 1
            return await asyncio.to_thread(self._generate, prompts, max_new_tokens,
                                           float(temperature), stop)

    def sample(self, prompts: list[list[int]], *, max_new_tokens: int,
               temperature: float = 1.0, stop: list[str] | None = None) -> list[Generation]:
        """`generate`, blocking the calling thread: for a process that does nothing
        else meanwhile (a policy server on a cluster node, rollout/fleet.py)."""
        self._check(prompts, max_new_tokens, temperature, stop)
        if not prompts:
            return []
        self.calls += 1
        return self._generate(prompts, max_new_tokens, float(temperature), stop)

    def _check(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
               stop: list[str] | None) -> None:
        check_generate_args(prompts, max_new_tokens, temperature, stop)
        longest = max((len(p) for p in prompts), default=0)
        if self.max_positions is not None and longest >= self.max_positions:
            raise UsageError(f"HFPolicy: a prompt of {longest} tokens leaves no room in the "
                             f"model's {self.max_positions} positions; shorten the context "
                             "(AgentConfig.max_context_tokens)")

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], max_new: int, temperature: float,
                  stop: list[str] | None) -> list[Generation]:
        was_training = self.model.training
        self.model.eval()
        try:
            return self._sample(prompts, max_new, temperature, stop)
        finally:
            self.model.train(was_training)

    def _sample(self, prompts: list[list[int]], max_new: int, temperature: float,
                stop: list[str] | None) -> list[Generation]:
        tok, dev = self.tokenizer, self.device
        B, L = len(prompts), max(len(p) for p in prompts)
        # Left-pad: every row's last prompt token sits in column L-1, so one step's
        # logits for all rows are out.logits[:, -1].
        ids = torch.full((B, L), tok.pad_id, dtype=torch.long, device=dev)  # (B, L)
        mask = torch.zeros((B, L), dtype=torch.long, device=dev)             # (B, L)
        for i, p in enumerate(prompts):
            ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long, device=dev)
            mask[i, L - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)                               # (B, L)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         use_cache=True)
        past, logits = _cache_of(out), out.logits[:, -1, :].float()           # (B, V)
        next_pos = pos[:, -1] + 1                                              # (B,)

        # A row ends ("length") at max_new tokens or at the model's last position,
        # whichever comes first: rows of one batch may have different room.
        caps = [max_new if self.max_positions is None
                else min(max_new, self.max_positions - len(p)) for p in prompts]
        gen_ids: list[list[int]] = [[] for _ in range(B)]
        gen_lp: list[list[float]] = [[] for _ in range(B)]
        reason = ["length"] * B
        texts = [""] * B
        rows = list(range(B))  # the prompt index of each row still in the batch
        for _ in range(max_new):
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)        # (b, V)
                nxt = torch.multinomial(logp.exp(), 1, generator=self.generator)  # (b, 1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                nxt = logp.argmax(-1, keepdim=True)
            lp = logp.gather(1, nxt).squeeze(1).tolist()                       # (b,)
            chosen = nxt.squeeze(1).tolist()
            keep: list[int] = []  # batch positions that go on
            for j, i in enumerate(rows):
                if i < 0:  # finished, still in a batch that cannot drop rows
                    continue
                gen_ids[i].append(chosen[j])
                gen_lp[i].append(lp[j])
                if chosen[j] == tok.eos_id:
                    reason[i] = "eos"
                    continue
                if stop:
                    before = len(texts[i])
                    texts[i] = tok.decode(gen_ids[i])
                    if stop_at(texts[i], stop, before) is not None:
                        reason[i] = "stop"
                        continue
                if len(gen_ids[i]) >= caps[i]:
                    continue  # reason stays "length"
                keep.append(j)
            if not keep:
                break
            if len(keep) < len(rows):
                if hasattr(past, "batch_select_indices"):
                    # Drop finished rows from the batch and its KV cache: with stop
                    # strings most rows end early, and a step costs in proportion to rows.
                    idx = torch.tensor(keep, dtype=torch.long, device=dev)
                    past.batch_select_indices(idx)
                    mask, nxt, next_pos = mask[idx], nxt[idx], next_pos[idx]
                    rows = [rows[j] for j in keep]
                else:  # finished rows keep stepping; their tokens are discarded
                    kept = set(keep)
                    rows = [i if j in kept else -1 for j, i in enumerate(rows)]
            mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype,
                                               device=dev)], 1)                 # (b, L+t)
            out = self.model(input_ids=nxt, attention_mask=mask,
                             position_ids=next_pos[:, None], use_cache=True,
                             **{self._cache_kw: past})
            past, logits = _cache_of(out), out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return [Generation(tok.decode(gen_ids[i]), tuple(gen_ids[i]), tuple(gen_lp[i]),
                           reason[i]) for i in range(B)]


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.inference_mode()
def sequence_logprobs(model: Any, prompt: Sequence[int], output: Sequence[int],
                      temperature: float = 1.0) -> list[float]:
    """log p(output[t] | prompt + output[:t]) under `model` at `temperature` (0: untempered),
    by one forward pass over the whole, unpadded sequence — the recomputation a trainer
    does and the check that `HFPolicy`'s sampled log-probs are exact."""
    dev = next(model.parameters()).device
    seq = torch.tensor([list(prompt) + list(output)], dtype=torch.long, device=dev)  # (1, T)
    logits = model(input_ids=seq).logits[0, len(prompt) - 1:-1, :].float()          # (N, V)
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    idx = torch.tensor(list(output), dtype=torch.long, device=dev)[:, None]
    return [float(x) for x in logp.gather(1, idx).squeeze(1).tolist()]
