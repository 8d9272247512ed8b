"""Command-line entry points of the training layer: `trialbox demo [sandbox]` and
`trialbox train CONFIG.toml`. Parser setup here is light (no torch import) so every
other `trialbox` command starts fast; the handlers import the heavy parts."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from trialbox.errors import UsageError


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "demo", help="the training demo: a tiny model learns to code by trial and error "
        "(`demo sandbox`: the sandbox and judge showcase)",
        description="Build a tiny transformer, warm-start it on generated programs, "
        "measure held-out pass@1, train it with GRPO over two-turn episodes judged in "
        "real sandboxes, measure again, and report (reward curve PNG, records, "
        "TensorBoard logs). `trialbox demo sandbox` runs the sandbox and judge showcase.")
    from trialbox.train.demo_args import add_arguments
    add_arguments(d)
    t = sub.add_parser(
        "train", help="train a policy from a TOML config (SFT warm start, GRPO)",
        description="Run the recipe of a TOML config: [run] [model] [sft] [grpo] "
        "[rollout] [eval] [tasks] [policy] (see trialbox/train/demo.toml and "
        "docs/training.md). [tasks]: the demo family, humaneval, JSONL/Parquet files or "
        "fsspec URLs, split into train/validation/test; [policy]: the local model "
        "(trained) or an OpenAI-compatible server (evaluation only). Unknown keys, "
        "inconsistent sizes, missing sources and empty splits are errors naming the "
        "field to change, before anything is written.")
    t.add_argument("config", help="the TOML file")
    t.add_argument("--seed", type=int, default=None, help="override [run] seed")
    t.add_argument("--out", default=None, help="override [run] out_dir")
    t.add_argument("--device", default=None, help="override [run] device (cpu, cuda)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in out_dir ([run] resume = true)")
    from trialbox.cluster.cli import add_cluster_arguments
    add_cluster_arguments(t, "every episode's sandbox sessions and trusted grading",
                          tier="the namespace tier")
    t.add_argument("--session-checkpoints", default=None, metavar="URL",
                   help="--backend ray: an artifact store every node reaches (e.g. "
                   "s3://bucket/prefix) to checkpoint each episode's session to after "
                   "every command, so a session moves to another node when its node is "
                   "lost instead of the episode being excluded (docs/cluster.md)")
    t.add_argument("--policy-servers", type=int, default=None, metavar="N",
                   help="--backend ray: sample the policy on N policy servers on the "
                   "cluster's GPU nodes (one per unit of --policy-resource) instead of "
                   "in this process; the trainer keeps the model and sends each version "
                   "of its weights to them (docs/cluster.md)")
    t.add_argument("--policy-resource", default="auto", metavar="NAME",
                   help="the Ray resource a policy server holds: GPU, a custom resource "
                   "such as trialbox_gpu (a GPU's stand-in), or auto (GPU if the cluster "
                   "has any, else trialbox_gpu)")


async def _train_on_cluster(config: Any, cluster: Any, say: Any,
                            checkpoints: str | None = None,
                            generation: Any = None) -> Any:
    """`--backend ray`: every episode's own sandbox sessions (the code it runs each turn,
    its files between turns: one node per episode, `cluster/sessions.py`) and every
    judging (each episode's grade and the pass@1 evaluations') on cluster nodes; the
    trainer stays here, and the policy samples here too unless `generation` (a
    `GenerationConfig`) puts it on policy servers."""
    from trialbox.cluster.serving import ClusterGrader
    from trialbox.cluster.sessions import RemoteProvider
    from trialbox.train.trainer import agent_config, train
    from trialbox.types import Grade, Task
    grader = await ClusterGrader.start(cluster, "namespace")
    language = agent_config(config).language
    try:
        sessions = await RemoteProvider.start(grader.backend, "namespace",
                                              checkpoints=checkpoints)
        try:
            start = None
            if generation is not None:
                from trialbox.rollout.fleet import PolicyFleet
                await PolicyFleet.check(generation)  # before anything is written

                def start(model: Any, tok: Any) -> Any:
                    return PolicyFleet.start(generation, model, tok)

            async def judged(task: Task, completion: str, seed: int | None) -> Grade:
                return await grader.grade(task, completion, language, seed)
            result = await train(config, pool=sessions, progress=say, grader=judged,
                                 generation=start)
        finally:
            await sessions.close()  # sessions an episode left open (none, if all ended)
        # where the work went: nodes, pieces placed (gradings and session calls), lost
        say("cluster", {**grader.status(), "sessions": sessions.opened,
                        "sessions_moved": sessions.moves})
        return result
    finally:
        await grader.close()


def main(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from trialbox.train.demo_run import main as demo_main
        return demo_main(args)
    from trialbox.train.config import load_config
    from trialbox.cluster.cli import check_local_flags
    check_local_flags(args)
    checkpoints = getattr(args, "session_checkpoints", None)
    if checkpoints is not None and getattr(args, "backend", "local") != "ray":
        raise UsageError("--session-checkpoints is for --backend ray (a local run's "
                         "sessions have no node to lose); drop it or add --backend ray")
    generation = _generation_config(args)
    run: dict[str, object] = {}
    for key, value in (("seed", args.seed), ("out_dir", args.out),
                       ("device", args.device)):
        if value is not None:
            run[key] = value
    if args.resume:
        run["resume"] = True
    config = load_config(args.config, {"run": run} if run else None)
    # The trainer (torch, transformers: ~10 s) is imported only once the config and the
    # flags are known good, so a mistake in either is refused at once.
    from trialbox.train.trainer import train
    if generation is not None:
        from trialbox.train.config import PolicyKind
        if config.policy.kind is not PolicyKind.LOCAL:
            raise UsageError("--policy-servers samples the model this run trains; "
                             "[policy] kind = 'openai' only evaluates a served model "
                             "(it already runs elsewhere): drop --policy-servers")
        from dataclasses import replace
        from trialbox.train.config import RolloutMode
        if config.rollout.mode is RolloutMode.ASYNC:  # every version in flight held
            generation = replace(generation, keep=max(generation.keep,
                                                      config.rollout.max_staleness + 1))

    def say(event: str, record: dict[str, object]) -> None:
        print(json.dumps({"event": event, **record}, default=str), flush=True)

    from trialbox.cluster.cli import cluster_config
    cluster = cluster_config(args)  # --backend ray: joined before anything is written
    if cluster is None:
        result = asyncio.run(train(config, progress=say))
    else:
        result = asyncio.run(_train_on_cluster(config, cluster, say, checkpoints,
                                               generation))
    print(json.dumps({"event": "done", "out_dir": result.out_dir,
                      "steps": result.steps_done, "pass_before": result.pass_before,
                      "pass_after": result.pass_after, "stopped": result.stopped}))
    return 0 if not result.stopped else 1


def _generation_config(args: argparse.Namespace) -> Any:
    """--policy-servers N [--policy-resource R] as a `GenerationConfig` (None: none
    asked for), refused without --backend ray."""
    n = getattr(args, "policy_servers", None)
    if n is None:
        if getattr(args, "policy_resource", "auto") != "auto":
            raise UsageError("--policy-resource goes with --policy-servers N; add it or "
                             "drop --policy-resource")
        return None
    if getattr(args, "backend", "local") != "ray":
        raise UsageError("--policy-servers places the policy on a Ray cluster's GPU "
                         "nodes; add --backend ray --address HEAD:6379, or drop it to "
                         "sample in this process")
    from trialbox.rollout.fleet import GenerationConfig
    return GenerationConfig(servers=n, resource=args.policy_resource)
