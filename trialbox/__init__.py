"""trialbox — agent reinforcement learning on code.

A model writes code; the code runs in an isolated sandbox (`trialbox.sandbox`); a
trusted judge turns what happened into a reward; a policy optimizer learns from it.
"""

__version__ = "0.1.0"
