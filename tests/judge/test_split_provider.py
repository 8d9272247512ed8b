"""`SplitProvider` (judge/provider.py): candidates from one provider, the trusted
harness's sessions from another — and, when the harness's tier cannot start or runs
another environment, the harness on the candidates' provider with a warning, never a
change of the candidates' tier. Fakes only (the real tiers: test_tiers.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from trialbox.errors import SandboxStartError, UsageError
from trialbox.judge import provider as judge_provider_module
from trialbox.judge.function import JudgeConfig, open_harness
from trialbox.judge.provider import SplitProvider, harness_provider, judge_provider
from trialbox.sandbox.fake import FakeProvider
from trialbox.types import Runtime


class Tiered(FakeProvider):
    """A fake provider that says it is of `tier`, and records its start and close."""

    def __init__(self, tier: str, *, fail_start: bool = False,
                 runtime: Runtime | None = None) -> None:
        super().__init__(runtime=runtime) if runtime else super().__init__()
        self.tier = tier  # type: ignore[misc]
        self.fail_start = fail_start
        self.started = self.closed = 0

    async def start(self) -> Tiered:
        self.started += 1
        if self.fail_start:
            raise SandboxStartError(f"the {self.tier} tier cannot start here (test)")
        return self

    async def close(self) -> None:
        self.closed += 1


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_candidate_opens_its_sessions_and_the_harness_its_own() -> None:
    cand, harness = Tiered("gvisor"), Tiered("namespace")

    async def go() -> None:
        async with SplitProvider(cand, harness) as split:
            assert split.tier == "gvisor" and split.runtime == cand.runtime
            assert harness_provider(split) is harness and split.parts == (cand, harness)
            cand.engine = "runsc"  # type: ignore[attr-defined]
            assert split.engine == "runsc"  # the rest is the candidates' provider's
            with pytest.raises(AttributeError):
                _ = split.no_such_thing
            sb = await split.open()
            h = await open_harness(split, JudgeConfig())
            assert cand.opened == [sb] and harness.opened == [h]
            assert h.limits == JudgeConfig().harness_limits  # its own limits, as before
    run(go())
    assert (cand.started, cand.closed, harness.started, harness.closed) == (1, 1, 1, 1)
    plain = Tiered("gvisor")
    assert harness_provider(plain) is plain  # any other provider: both sides in it


@pytest.mark.parametrize("why, make_harness", [
    ("could not start", lambda: Tiered("namespace", fail_start=True)),
    ("not the candidates' environment",
     lambda: Tiered("namespace", runtime=Runtime("other", "/usr/bin/python3", "3.12"))),
])
def test_a_harness_tier_that_cannot_serve_leaves_the_harness_with_the_candidate(
        caplog: pytest.LogCaptureFixture, why: str,
        make_harness: Callable[[], Tiered]) -> None:
    cand, harness = Tiered("gvisor"), make_harness()

    async def go() -> None:
        async with SplitProvider(cand, harness) as split:
            assert split.tier == "gvisor"  # the candidates' tier never changes
            assert harness_provider(split) is cand and split.parts == (cand,)
            await open_harness(split)
            assert len(cand.opened) == 1 and harness.opened == []
    with caplog.at_level(logging.WARNING, logger="trialbox.judge.provider"):
        run(go())
    assert harness.closed == 1 and cand.closed == 1
    said = " ".join(r.getMessage() for r in caplog.records)
    assert why in said and "the trusted harness runs on the gvisor tier too" in said, said


def test_a_candidate_tier_that_cannot_start_is_an_error_not_a_fallback() -> None:
    split = SplitProvider(Tiered("gvisor", fail_start=True), Tiered("namespace"))
    with pytest.raises(SandboxStartError):
        run(split.start())


def test_both_sides_must_pass_fds() -> None:
    with pytest.raises(UsageError, match="pass fds"):
        SplitProvider(FakeProvider(), FakeProvider(passes_fds=False))


def test_judge_provider_splits_the_oci_tiers_and_keeps_namespace_whole(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The wiring `trialbox eval --tier` uses, with the tiers' providers faked."""
    made: dict[str, list[Tiered]] = {}
    broken = {"namespace": False}

    def factories(warm: int, image: str) -> dict[str, Callable[[], Tiered]]:
        def make(tier: str) -> Callable[[], Tiered]:
            def new() -> Tiered:
                p = Tiered(tier, fail_start=tier == "namespace" and broken["namespace"])
                made.setdefault(tier, []).append(p)
                return p
            return new
        return {t: make(t) for t in ("namespace", "gvisor", "container")}
    monkeypatch.setattr(judge_provider_module, "_factories", factories)

    async def sides(tier: str, **kw: Any) -> tuple[str, str]:
        async with judge_provider(tier, warm=4, **kw) as p:
            return p.tier, harness_provider(p).tier
    assert run(sides("gvisor")) == ("gvisor", "namespace")
    assert run(sides("container")) == ("container", "namespace")
    assert run(sides("namespace")) == ("namespace", "namespace")
    assert run(sides("gvisor", split=False)) == ("gvisor", "gvisor")
    assert all(p.closed == p.started for ps in made.values() for p in ps)
    broken["namespace"] = True
    with caplog.at_level(logging.WARNING, logger="trialbox.judge.provider"):
        assert run(sides("gvisor")) == ("gvisor", "gvisor")
    assert "namespace tier could not start" in caplog.text, caplog.text
