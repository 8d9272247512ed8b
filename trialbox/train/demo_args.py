"""The options of `trialbox demo` (kept apart from demo_run.py, which imports torch)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", nargs="?", choices=["train", "sandbox"], default="train",
                   help="train (default): the training demo; sandbox: the sandbox and "
                   "judge showcase (good and hostile programs, honest and cheating "
                   "solutions)")
    p.add_argument("--seed", type=int, default=None,
                   help="the run's seed (default: the recipe's, 3; the recipe was tuned "
                   "on 0, 1, 2)")
    p.add_argument("--seeds", default=None, metavar="S1,S2,…",
                   help="run the whole demo once per seed and print a before/after table "
                   "(make bench)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="run directory (default runs/demo-seed<N>)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the results (per seed) as JSON to FILE")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny budget (seconds): checks the plumbing, not the learning")
    p.add_argument("--device", default=None, help="cpu (default) or cuda")
