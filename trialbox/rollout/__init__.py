"""Rollouts: policies (policy.py) and the multi-turn agent loop (agent.py).

An episode: prompt → `Policy.generate` (no sandbox held) → extract the code → run it in
the episode's sandbox session (leased only for the run) → the trusted judge grades it →
feedback → next turn, until it passes or `max_turns`. The result is a `Trajectory`
(trialbox.types): the exact token ids, a loss mask, per-token log-probs, the reward.
"""
