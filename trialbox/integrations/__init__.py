"""trialbox behind the trainers and environments people already run (docs/integrations.md).

- `trialbox.integrations.trl`: a reward function for TRL's `GRPOTrainer` (sync and async);
- `trialbox.integrations.trl_env`: an environment class for its `environment_factory`;
- `trialbox.integrations.verl`: `compute_score` for verl's `custom_reward_function`;
- `trialbox.integrations.gym`: a gym-style multi-turn code environment (sync and async);
- `trialbox.integrations.grader`: what they share — one judge pool, reused across calls.

The core never imports this package, and none of these modules imports its trainer
library: TRL, verl or gymnasium need not be installed to use them (the extras in
pyproject.toml install the trainers themselves).
"""

from __future__ import annotations
