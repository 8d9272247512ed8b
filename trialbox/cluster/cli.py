"""The `--backend local|ray` options of the commands that can run on a cluster, and the
eval entry point. Imports Ray only when `--backend ray` is chosen."""

from __future__ import annotations

import argparse
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.function import JudgeConfig
from trialbox.judge.reward import RewardSpec
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.types import GradedRow, Sample, Task


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: this machine (default); ray: the same scheduler and "
                   "journal here, each attempt graded on a node of a Ray cluster "
                   "(pip install trialbox[ray]; docs/cluster.md)")
    p.add_argument("--address", default="auto", metavar="auto|HOST:PORT",
                   help="--backend ray: the cluster's head (default auto: the cluster "
                   "`ray start` made on this machine)")
    p.add_argument("--tier", default="namespace",
                   help="the isolation tier every attempt is graded in: namespace "
                   "(default), gvisor, container; a tier that cannot run is an error, never "
                   "a fallback (--backend ray: the nodes offering it with their "
                   "trialbox_tier_<name> resource)")
    _idle_release_argument(p)


def _idle_release_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-release-s", type=float, default=None, metavar="S",
                   help="--backend ray: close a node that has had no work and no session "
                   "for S seconds (its pools and actor; the machine is then free for the "
                   "cluster's autoscaler) and admit it again when work waits for its tier "
                   "(default: nodes stay for the whole run)")


def add_cluster_arguments(p: argparse.ArgumentParser, what: str,
                          tier: str = "--tier") -> None:
    """--backend/--address for a command that chooses its tier itself (serve: its own
    --tier; train: the namespace tier)."""
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help=f"local: this machine (default); ray: {what} on the nodes of a Ray "
                   f"cluster offering {tier} (pip install trialbox[ray]; docs/cluster.md)")
    p.add_argument("--address", default="auto", metavar="auto|HOST:PORT",
                   help="--backend ray: the cluster's head (default auto: the cluster "
                   "`ray start` made on this machine)")
    _idle_release_argument(p)


def check_local_flags(args: argparse.Namespace) -> None:
    """Refuse a cluster-only option given without --backend ray (it would do nothing)."""
    if getattr(args, "backend", "local") != "ray" and getattr(
            args, "idle_release_s", None) is not None:
        raise UsageError("--idle-release-s releases idle cluster nodes: it needs "
                         "--backend ray (drop it to run on this machine)")


def cluster_config(args: argparse.Namespace) -> Any:
    """The ClusterConfig of --backend ray (None for local); Ray is needed only then."""
    check_local_flags(args)
    if getattr(args, "backend", "local") != "ray":
        return None
    _ray_or_explain()
    from trialbox.cluster.backend import ClusterConfig
    return ClusterConfig(address=args.address,
                         idle_release_s=getattr(args, "idle_release_s", None))


def _ray_or_explain() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise UsageError("--backend ray needs Ray: pip install 'trialbox[ray]' (on the "
                         "driver and on every node)") from e


async def eval_on_ray(args: argparse.Namespace, tasks: dict[str, Task],
                      samples: list[Sample], config: JudgeConfig | None,
                      stdio: StdioJudgeConfig | None, spec: RewardSpec | None,
                      ) -> tuple[list[GradedRow], dict[str, Any]]:
    _ray_or_explain()
    if getattr(args, "image", ""):
        raise UsageError("--image with --backend ray is not supported yet: the nodes' "
                         "pools run their own system runtime; drop --image, or run the "
                         "eval locally")
    from trialbox.cluster.backend import ClusterConfig
    from trialbox.cluster.evaljob import eval_on_cluster
    with open(args.samples, "rb") as f:
        raw = f.read()
    return await eval_on_cluster(
        tasks, samples, cluster=ClusterConfig(
            address=args.address, idle_release_s=getattr(args, "idle_release_s", None)),
        tier=args.tier,
        workers=args.workers, repeat=args.repeat, db=args.db, run=args.run,
        resume=args.resume, samples_bytes=raw, reward=args.reward,
        time_scale=args.time_scale, amplified=args.amplified, config=config,
        stdio_config=stdio, reward_spec=spec)
