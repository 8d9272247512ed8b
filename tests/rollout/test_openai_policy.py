"""OpenAIPolicy (the real client) against a real HTTP server on a loopback port: a small
OpenAI-compatible /v1/completions endpoint serving scripted completions, standing in
for vLLM. Retries, backoff and the errors are exercised over real sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trialbox.errors import InfraError, UsageError
from trialbox.rollout.openai_policy import OpenAIConfig, OpenAIPolicy
from trialbox.rollout.policy import ByteTokenizer, make_policy

TOK = ByteTokenizer()
FAST = OpenAIConfig(timeout_s=2, retries=2, backoff_s=0.01, max_backoff_s=0.05)


class FakeVLLM(ThreadingHTTPServer):
    """Answers each prompt with `reply(prompt_text)` as byte tokens ("token_id:N"), the
    i-th token's log-prob -0.01 * (i + 1). `faults` is consumed one per request first:
    an int status code (with Retry-After: 0), or "hang" (sleeps past the timeout)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.faults: list[int | str] = []
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.tokens_as_ids = True

    @staticmethod
    def reply(prompt: str) -> str:
        return f"echo {len(prompt)}: ```python\nprint(1)\n``` and more text"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeVLLM

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, obj: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            fault = self.server.faults.pop(0) if self.server.faults else None
        if fault == "hang":
            time.sleep(3)
            return
        if isinstance(fault, int):
            self._send(fault, {"error": {"message": f"scripted {fault}"}},
                       {"Retry-After": "0"})
            return
        if self.path != "/v1/completions":
            self._send(404, {"error": "no such route"})
            return
        if body.get("max_tokens", 0) > 1000:
            self._send(400, {"error": {"message": "max_tokens is too large for the model"}})
            return
        prompt = body["prompt"]
        text = self.server.reply(TOK.decode(prompt) if isinstance(prompt, list) else prompt)
        finish = "stop"
        ends = [text.find(s) + len(s) for s in body.get("stop") or [] if s in text]
        ids = TOK.encode(text[:min(ends)] if ends else text)
        if not ends:
            ids.append(256)  # EOS
        if len(ids) > body["max_tokens"]:
            ids, finish = ids[:body["max_tokens"]], "length"
        tokens = [f"token_id:{i}" if self.server.tokens_as_ids else chr(i % 128)
                  for i in ids]
        self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                         "choices": [{"index": 0, "text": TOK.decode(ids),
                                      "finish_reason": finish,
                                      "logprobs": {"tokens": tokens,
                                                   "token_logprobs": [-0.01 * (k + 1)
                                                                      for k in range(len(ids))],
                                                   "top_logprobs": None}}]})


@pytest.fixture
def server() -> Iterator[FakeVLLM]:
    srv = FakeVLLM()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def gen(policy, prompts, **kw):
    kw = {"max_new_tokens": 100, "temperature": 0.5, "stop": None, **kw}

    async def go():
        try:
            return await policy.generate(prompts, **kw)
        finally:
            await policy.aclose()
    return asyncio.run(go())


def test_token_ids_in_and_out(server):
    policy = OpenAIPolicy(server.url, "tiny", TOK, config=FAST)
    prompts = [TOK.encode("def f():"), TOK.encode("a longer prompt")]
    gens = gen(policy, prompts)
    # sent as ids, not text (one request per prompt, concurrently: any order)
    assert sorted(b["prompt"] for b in server.bodies) == sorted(prompts)
    assert server.bodies[0]["logprobs"] == 1 and server.bodies[0]["temperature"] == 0.5
    assert server.bodies[0]["return_tokens_as_token_ids"] is True
    for p, g in zip(prompts, gens, strict=True):
        want = FakeVLLM.reply(TOK.decode(p))
        assert g.token_ids == tuple(TOK.encode(want)) + (256,)
        assert g.text == want and g.finish_reason == "eos"
        assert g.logprobs == pytest.approx([-0.01 * (k + 1) for k in range(len(g.token_ids))])
    # Stop strings end the text (kept in it) and the token limit truncates.
    [g] = gen(policy, [prompts[0]], stop=["nothing like it", "(1)\n"])
    assert g.finish_reason == "stop" and g.text.endswith("```python\nprint(1)\n")
    assert server.bodies[-1]["stop"] == ["nothing like it", "(1)\n"]
    [g] = gen(policy, [prompts[0]], max_new_tokens=5)
    assert g.finish_reason == "length" and len(g.token_ids) == 5
    # Text prompts, and a base_url that already ends in /v1.
    text_policy = OpenAIPolicy(server.url + "/v1/", "tiny", TOK,
                               config=OpenAIConfig(prompt_as="text"))
    gen(text_policy, [prompts[1]])
    assert server.bodies[-1]["prompt"] == "a longer prompt"


def test_429_then_success_and_5xx_retried(server):
    server.faults = [429, 503]
    policy = OpenAIPolicy(server.url, "tiny", TOK, config=FAST)
    [g] = gen(policy, [TOK.encode("x")])
    assert g.finish_reason == "eos"
    assert policy.requests == 3 and policy.retried == 2 and len(server.bodies) == 3


def test_persistent_failure_is_infra_after_the_cap(server):
    server.faults = [500] * 10
    policy = OpenAIPolicy(server.url, "tiny", TOK, config=FAST)
    with pytest.raises(InfraError, match="failed 3 times; last: HTTP 500"):
        gen(policy, [TOK.encode("x")])
    assert len(server.bodies) == 3


def test_hanging_server_times_out_and_retries(server):
    server.faults = ["hang"]
    policy = OpenAIPolicy(server.url, "tiny", TOK,
                          config=OpenAIConfig(timeout_s=0.3, retries=1, backoff_s=0.01))
    [g] = gen(policy, [TOK.encode("x")])  # the second attempt is answered
    assert policy.retried == 1 and g.finish_reason == "eos"


def test_dead_server_is_infra():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}", "tiny", TOK, config=FAST)
    with pytest.raises(InfraError, match="ConnectError"):
        gen(policy, [TOK.encode("x")])
    assert policy.requests == 3


def test_caller_mistakes_are_usage_errors(server):
    policy = OpenAIPolicy(server.url, "tiny", TOK, config=FAST)
    with pytest.raises(UsageError, match="HTTP 400.*max_tokens is too large"):
        gen(policy, [TOK.encode("x")], max_new_tokens=5000)
    assert policy.retried == 0, "a 400 is not retried"
    server.tokens_as_ids = False
    with pytest.raises(UsageError, match="return_tokens_as_token_ids"):
        gen(policy, [TOK.encode("x")])
    with pytest.raises(UsageError, match="base_url"):
        OpenAIPolicy("localhost:8000", "tiny", TOK)
    with pytest.raises(UsageError, match="prompt_as"):
        OpenAIConfig(prompt_as="chat")
    with pytest.raises(UsageError, match="max_new_tokens"):
        gen(policy, [TOK.encode("x")], max_new_tokens=0)
    assert isinstance(make_policy("openai", base_url=server.url, model="tiny",
                                  tokenizer=TOK), OpenAIPolicy)


def test_agent_loop_over_http(server, runner):
    """rollout() with the HTTP policy: the server's token ids are the trajectory's model
    tokens, its log-probs the old log-probs; prompts travel as the exact context ids."""
    from trialbox.rollout.agent import AgentConfig, rollout
    from trialbox.sandbox.namespace import NamespaceSandbox
    from trialbox.schedule.lease import DirectLeaser
    from trialbox.types import Task, TaskKind, TestCase

    async def opener(limits):
        return await NamespaceSandbox.open(runner.pool, limits)

    task = Task("one", TaskKind.STDIO, "Print 1.",
                visible_tests=(TestCase("v", expected=b"1\n"),),
                hidden_tests=(TestCase("h", stdin=b"ignored", expected=b"1\n"),))
    policy = OpenAIPolicy(server.url, "tiny", TOK, config=FAST)
    cfg = AgentConfig(max_new_tokens=200, batch_wait_s=0.01)
    batch = runner.run(rollout(policy, [task], group_size=2, max_turns=2, config=cfg,
                               pool=runner.pool, leaser=DirectLeaser(opener)))
    runner.run(policy.aclose())
    for tr in batch.trajectories:
        assert tr.passed and tr.reward == 1.0 and len(tr.turns) == 1
        t = tr.turns[0]
        assert t.code == "print(1)\n" and t.finish_reason == "eos"
        assert t.output_ids == tuple(TOK.encode(FakeVLLM.reply(TOK.decode(tr.prompt_ids)))) \
            + (256,)
        assert t.logprobs == pytest.approx([-0.01 * (k + 1) for k in range(len(t.output_ids))])
    assert sorted(b["prompt"] for b in server.bodies) == sorted(list(tr.prompt_ids)
                                                               for tr in batch.trajectories)
