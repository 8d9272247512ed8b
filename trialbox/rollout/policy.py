"""Policies: one small interface between the agent loop and whatever writes the code.

    class Policy(Protocol):
        tokenizer: Tokenizer
        async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                           temperature: float, stop: list[str] | None) -> list[Generation]

Token in, token out: prompts are token ids (the agent loop builds the context from the
exact ids generated so far, never re-tokenising the model's output) and each
`Generation` carries the ids sampled, their text and the log-prob of each id under the
distribution it was drawn from (the `old_logprobs` of a policy-gradient step).

Implementations: `ScriptedPolicy` (tests; scripted texts, byte tokenizer) here;
`HFPolicy` (a local `transformers` causal LM, hf_policy.py) and `OpenAIPolicy` (an
OpenAI-compatible `/v1/completions` server such as vLLM, openai_policy.py).
`make_policy(kind, ...)` builds one by name. Tokenizers: `ByteTokenizer` (bytes are
ids), `HFTokenizer` (wraps a `transformers` tokenizer; `as_tokenizer` picks).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trialbox.errors import UsageError


@runtime_checkable
class Tokenizer(Protocol):
    """What the agent loop needs of a tokenizer: text ↔ ids and two special ids."""

    eos_id: int | None
    """The id that ends a generation (None: the model has no end-of-sequence token)."""
    pad_id: int
    """The id used to left-pad a batch (never attended to)."""

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, with no special tokens added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens dropped; invalid bytes become U+FFFD)."""
        ...


@dataclass(frozen=True)
class Generation:
    """One completion of one prompt."""

    text: str
    """The decoding of `token_ids` (a stop string, when one ended it, is included)."""
    token_ids: tuple[int, ...]
    """Exactly the ids sampled, in order (the EOS id included when it ended the text)."""
    logprobs: tuple[float, ...]
    """log p(token) under the distribution it was sampled from (temperature applied)."""
    finish_reason: str = "length"
    """"stop" (a stop string appeared), "eos" (the EOS id was sampled) or "length"."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise UsageError(f"Generation: {len(self.token_ids)} token ids but "
                             f"{len(self.logprobs)} log-probs")
        if self.finish_reason not in ("stop", "eos", "length"):
            raise UsageError(f"Generation.finish_reason must be 'stop', 'eos' or 'length', "
                             f"got {self.finish_reason!r}")


class Policy(Protocol):
    """Writes completions for a batch of prompts. Implementations must not block the
    event loop (sandboxes keep running while the model thinks)."""

    tokenizer: Tokenizer

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float, stop: list[str] | None) -> list[Generation]:
        """One `Generation` per prompt, in order. `temperature` 0 means greedy (log-probs
        then of the untempered distribution). Generation ends at the EOS id, at the end
        of the first occurrence of any `stop` string, or after `max_new_tokens`."""
        ...


def check_generate_args(prompts: list[list[int]], max_new_tokens: int,
                        temperature: float, stop: list[str] | None) -> None:
    """The argument checks every implementation shares; errors say what to change."""
    if not isinstance(prompts, list) or not all(isinstance(p, list) for p in prompts):
        raise UsageError("generate: prompts must be a list of token-id lists")
    if any(not p for p in prompts):
        raise UsageError("generate: every prompt needs at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise UsageError(f"generate: max_new_tokens must be an int >= 1, got "
                         f"{max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise UsageError(f"generate: temperature must be a finite number >= 0, got "
                         f"{temperature!r}")
    if stop is not None and (not isinstance(stop, list)
                             or not all(isinstance(s, str) and s for s in stop)):
        raise UsageError("generate: stop must be None or a list of non-empty strings")


def stop_at(text: str, stop: Sequence[str] | None, start: int = 0) -> int | None:
    """The end offset of the earliest stop string in `text` found at or after `start`
    (search from a little before new text so a stop split across tokens is seen).

    >>> stop_at("abc```\\nx", ["```"])
    6
    """
    best: int | None = None
    for s in stop or ():
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return best


# --------------------------------------------------------------------------- bytes

class ByteTokenizer:
    """Bytes are ids 0..255; `eos_id` = 256, `pad_id` = 257 (vocab_size 258). Any text
    round-trips; the smallest tokenizer a model can learn code with.

    >>> ByteTokenizer().encode("hé")
    [104, 195, 169]
    """

    vocab_size = 258

    def __init__(self) -> None:
        self.eos_id: int | None = 256
        self.pad_id: int = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="surrogatepass"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """The `Tokenizer` protocol over a `transformers` tokenizer (no special tokens added
    on encode; special tokens dropped on decode)."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.eos_id: int | None = tok.eos_token_id
        pad = tok.pad_token_id
        if pad is None:
            pad = tok.eos_token_id if tok.eos_token_id is not None else 0
        self.pad_id: int = int(pad)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))


def as_tokenizer(tok: Any) -> Tokenizer:
    """`tok` itself when it already speaks the protocol, else wrapped (`transformers`)."""
    if isinstance(tok, Tokenizer):
        return tok
    if hasattr(tok, "eos_token_id") and hasattr(tok, "encode"):
        return HFTokenizer(tok)
    raise UsageError(f"tokenizer: need an object with encode/decode/eos_id/pad_id or a "
                     f"transformers tokenizer, got {type(tok).__name__}")


# --------------------------------------------------------------------------- scripted

Script = Callable[[str, int], str]
"""(decoded prompt, the episode's turn: 0, 1, ...) -> the text."""


class ScriptedPolicy:
    """For tests: answers from a script instead of a model.

    `script` is either a list of texts (turn k of every episode gets `texts[k]`, the last
    one repeated) or a function `(prompt_text, turn) -> text`; `turn` counts the
    episode's earlier turns (found by which earlier prompt + output the prompt extends).
    Output ids are the byte tokenizer's encoding of the text (plus EOS unless a stop
    string or the token limit ended it); every log-prob is `logprob` (default log 0.5).
    `on_generate`, when given, is awaited at the start of each call (tests use it to look
    at the world while the "model" thinks); `calls` records each batch's size."""

    def __init__(self, script: Sequence[str] | Script, *, logprob: float = math.log(0.5),
                 on_generate: Callable[[list[list[int]]], Any] | None = None,
                 delay_s: float = 0.0):
        if isinstance(script, str):
            raise UsageError("ScriptedPolicy: give a list of texts or a function, not a str")
        if not callable(script) and not script:
            raise UsageError("ScriptedPolicy: the script has no texts")
        self.tokenizer: Tokenizer = ByteTokenizer()
        self.script = script
        self.logprob = logprob
        self.on_generate = on_generate
        self.delay_s = delay_s
        self.calls: list[int] = []
        self.prompts_seen: list[str] = []
        """Every prompt, decoded (the EOS ids inside a multi-turn context dropped)."""
        self.prompt_ids_seen: list[list[int]] = []
        """Every prompt exactly as given."""
        self._after: dict[tuple[int, ...], int] = {}

    def _turn(self, prompt: list[int]) -> int:
        """Which turn of its episode `prompt` is: the turn after the longest earlier
        prompt + output it extends (0 when it extends none). Samples of one group share
        their first prompt but each has its own outputs, so each counts its own turns."""
        best, turn = -1, 0
        for key, t in self._after.items():
            if len(key) > best and tuple(prompt[:len(key)]) == key:
                best, turn = len(key), t
        return turn

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float = 1.0,
                       stop: list[str] | None = None) -> list[Generation]:
        check_generate_args(prompts, max_new_tokens, temperature, stop)
        self.calls.append(len(prompts))
        if self.on_generate is not None:
            maybe = self.on_generate(prompts)
            if asyncio.iscoroutine(maybe):
                await maybe
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = []
        for p in prompts:
            prompt = self.tokenizer.decode(p)
            self.prompts_seen.append(prompt)
            self.prompt_ids_seen.append(list(p))
            turn = self._turn(p)
            text = self.script(prompt, turn) if callable(self.script) \
                else self.script[min(turn, len(self.script) - 1)]
            end = stop_at(text, stop)
            reason = "stop" if end is not None else "eos"
            ids = self.tokenizer.encode(text[:end] if end is not None else text)
            if reason == "eos":
                ids.append(256)
            if len(ids) > max_new_tokens:
                ids, reason = ids[:max_new_tokens], "length"
            self._after[tuple(p) + tuple(ids)] = turn + 1
            out.append(Generation(self.tokenizer.decode(ids), tuple(ids),
                                  (self.logprob,) * len(ids), reason))
        return out


# --------------------------------------------------------------------------- by name

POLICY_KINDS = ("hf", "openai", "scripted")


def make_policy(kind: str, **options: Any) -> Policy:
    """A policy by name — "hf" (`HFPolicy.from_pretrained(path, ...)`), "openai"
    (`OpenAIPolicy(base_url, model, tokenizer, ...)`) or "scripted"
    (`ScriptedPolicy(script, ...)`); options go to that constructor."""
    if kind == "hf":
        from trialbox.rollout.hf_policy import HFPolicy
        if "path" not in options:
            raise UsageError("make_policy('hf'): give path= (a local model directory)")
        return HFPolicy.from_pretrained(options.pop("path"), **options)
    if kind == "openai":
        from trialbox.rollout.openai_policy import OpenAIPolicy
        return OpenAIPolicy(**options)
    if kind == "scripted":
        return ScriptedPolicy(**options)
    raise UsageError(f"unknown policy kind {kind!r}; use one of {', '.join(POLICY_KINDS)}")
