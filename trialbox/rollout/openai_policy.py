"""`OpenAIPolicy`: an OpenAI-compatible `/v1/completions` server (vLLM, SGLang) as a
`Policy`, token in and token out.

    policy = OpenAIPolicy("http://127.0.0.1:8000", "Qwen/Qwen2.5-0.5B", tokenizer)
    gens = await policy.generate([ids], max_new_tokens=256, temperature=1.0, stop=None)

Each prompt is one request (the server batches them continuously), sent as token ids
(`prompt_as="ids"`, the default: nothing is re-tokenised) or as text. The request asks
for the sampled tokens' log-probs (`logprobs: 1`) and for the tokens as ids
(`return_tokens_as_token_ids`, vLLM's "token_id:N" form), with stop strings kept in the
text (`include_stop_str_in_output`), so ids, text and log-probs agree. A server that
cannot return token ids is refused with an error that says so.

Failures: connection errors, timeouts, 429 and 5xx are retried with exponential backoff
(a `Retry-After` header is honoured, capped); after `retries` the call raises
`InfraError` naming the last cause. Other 4xx answers are the caller's mistake
(`UsageError` with the server's message).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import httpx

from trialbox.errors import InfraError, UsageError
from trialbox.rollout.policy import Generation, Tokenizer, as_tokenizer, check_generate_args


@dataclass(frozen=True)
class OpenAIConfig:
    """How the client talks to the server."""

    timeout_s: float = 120.0
    """One request's timeout (connect, read, write)."""
    retries: int = 4
    """Extra attempts after a retryable failure (connection, timeout, 429, 5xx)."""
    backoff_s: float = 0.5
    """First wait before a retry; doubled each time."""
    max_backoff_s: float = 10.0
    """Longest wait between attempts (also caps a server's Retry-After)."""
    max_concurrency: int = 64
    """Requests in flight at once."""
    prompt_as: str = "ids"
    """"ids": send the prompt's token ids; "text": send its decoding."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "backoff_s", "max_backoff_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UsageError(f"OpenAIConfig.{name} must be a finite number >= 0, got "
                                 f"{v!r}")
        if self.timeout_s == 0:
            raise UsageError("OpenAIConfig.timeout_s must be > 0")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 0:
            raise UsageError(f"OpenAIConfig.retries must be an int >= 0, got "
                             f"{self.retries!r}")
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int) \
                or self.max_concurrency < 1:
            raise UsageError(f"OpenAIConfig.max_concurrency must be an int >= 1, got "
                             f"{self.max_concurrency!r}")
        if self.prompt_as not in ("ids", "text"):
            raise UsageError(f"OpenAIConfig.prompt_as must be 'ids' or 'text', got "
                             f"{self.prompt_as!r}")


class _Retry(Exception):
    def __init__(self, cause: str, wait_s: float | None = None):
        super().__init__(cause)
        self.cause, self.wait_s = cause, wait_s


class OpenAIPolicy:
    """A client of one model on one OpenAI-compatible server. `tokenizer` must be the
    model's (it decodes prompts for `prompt_as="text"` and names the EOS id)."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, *,
                 api_key: str | None = None, config: OpenAIConfig | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise UsageError(f"OpenAIPolicy: base_url must start with http:// or https://, "
                             f"got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise UsageError("OpenAIPolicy: model must be the served model's name")
        base = base_url.rstrip("/")
        self.url = base + ("/completions" if base.endswith("/v1") else "/v1/completions")
        self.model = model
        self.tokenizer: Tokenizer = as_tokenizer(tokenizer)
        self.config = config or OpenAIConfig()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.transport = transport
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0
        """HTTP requests sent (retries included)."""
        self.retried = 0

    def _http(self) -> httpx.AsyncClient:
        # A client belongs to the event loop it was made on; tests and CLIs may use many.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.config.timeout_s), transport=self.transport,
                limits=httpx.Limits(max_connections=self.config.max_concurrency),
                headers=self.headers)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float = 1.0,
                       stop: list[str] | None = None) -> list[Generation]:
        check_generate_args(prompts, max_new_tokens, temperature, stop)
        slots = asyncio.Semaphore(self.config.max_concurrency)

        async def one(p: list[int]) -> Generation:
            async with slots:
                return await self._complete(p, max_new_tokens, float(temperature), stop)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    async def _complete(self, prompt: list[int], max_new: int, temperature: float,
                        stop: list[str] | None) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt if self.config.prompt_as == "ids"
            else self.tokenizer.decode(prompt),
            "max_tokens": max_new, "temperature": temperature, "n": 1, "logprobs": 1,
            "return_tokens_as_token_ids": True, "include_stop_str_in_output": True,
            "skip_special_tokens": False}
        if stop:
            body["stop"] = stop
        last = ""
        for attempt in range(1 + self.config.retries):
            if attempt:
                self.retried += 1
            try:
                return self._parse(await self._post(body))
            except _Retry as e:
                last = e.cause
                if attempt == self.config.retries:
                    break
                wait = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** attempt)
                if e.wait_s is not None:
                    wait = min(self.config.max_backoff_s, max(wait, e.wait_s))
                await asyncio.sleep(wait)
        raise InfraError(f"the model server at {self.url} failed {1 + self.config.retries} "
                         f"times; last: {last}")

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        try:
            r = await self._http().post(self.url, json=body)
        except httpx.TimeoutException as e:
            raise _Retry(f"timed out after {self.config.timeout_s} s ({type(e).__name__})"
                         ) from e
        except httpx.TransportError as e:
            raise _Retry(f"{type(e).__name__}: {e}") from e
        if r.status_code == 429 or r.status_code >= 500:
            raise _Retry(f"HTTP {r.status_code}: {r.text[:300]}", _retry_after(r))
        if r.status_code >= 400:
            hint = {401: " (check api_key)", 403: " (check api_key)",
                    404: " (check base_url and the model name)"}.get(r.status_code, "")
            raise UsageError(f"the model server refused the request: HTTP {r.status_code}"
                             f"{hint}: {r.text[:500]}")
        try:
            data = r.json()
        except ValueError as e:
            raise InfraError(f"the model server answered with non-JSON: {r.text[:200]!r}"
                             ) from e
        if not isinstance(data, dict):
            raise InfraError(f"the model server answered {type(data).__name__}, not an "
                             "object")
        return data

    def _parse(self, data: dict[str, Any]) -> Generation:
        try:
            choice = data["choices"][0]
            text = choice["text"]
            lp = choice["logprobs"]
            tokens, token_lps = lp["tokens"], lp["token_logprobs"]
            finish = choice.get("finish_reason") or "length"
        except (KeyError, IndexError, TypeError) as e:
            raise InfraError(f"malformed completion from the model server (missing {e}); "
                             "it must answer /v1/completions with logprobs") from e
        ids = []
        for t in tokens:
            if not (isinstance(t, str) and t.startswith("token_id:")):
                raise UsageError(
                    f"the model server returned token {t!r}, not 'token_id:N': it must "
                    "support return_tokens_as_token_ids (vLLM does) — token ids cannot be "
                    "recovered from text without re-tokenising")
            ids.append(int(t[len("token_id:"):]))
        if len(token_lps) != len(ids) or not all(isinstance(x, (int, float))
                                                 for x in token_lps):
            raise InfraError("the model server's log-probs do not match its tokens")
        eos = self.tokenizer.eos_id
        reason = "length" if finish == "length" else \
            "eos" if ids and eos is not None and ids[-1] == eos else "stop"
        return Generation(str(text), tuple(ids), tuple(float(x) for x in token_lps), reason)


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return max(0.0, float(r.headers["retry-after"]))
    except (KeyError, ValueError):
        return None
