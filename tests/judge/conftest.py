"""The judge's suites run on a judge pool (`judge_pool_config`: the codec, stub and
harness preloaded in the sandboxes' interpreter, the lean JUDGE_PRELOAD), the pool
`trialbox eval` and the bench use, so every exploit and every canonical solution is
graded by the configuration that ships. The sandbox suites keep the default pool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.conftest import Runner
from trialbox.judge.function import _preloaded, judge_pool_config
from trialbox.sandbox import CellPool


class JudgeRunner(Runner):
    def __init__(self) -> None:  # Runner's, with a judge pool
        self.loop = asyncio.new_event_loop()
        self.pool: CellPool = self.run(CellPool(judge_pool_config(warm=2)).start())


@pytest.fixture(scope="session")
def runner() -> Iterator[Runner]:
    r = JudgeRunner()
    assert _preloaded(r.pool)
    yield r
    r.close()
