"""The exception tree. Three kinds of failure, never confused (DESIGN.md decision 1).

    TrialboxError
    ├── UsageError            the *caller* misused the API: fix the call (raised at once)
    │   ├── LimitsError       a Limits field is out of range
    │   └── UnknownLanguage   no runner for the requested language
    └── InfraError            the *infrastructure* failed: retry; if it persists,
        │                     exclude the sample (reward None, never 0.0)
        ├── SandboxUnavailable  this host cannot provide the requested tier
        ├── SandboxStartError   a sandbox could not be started or set up
        └── ZygoteDied          the warm fork server died

What the *candidate* did (wrong answer, crash, timeout, OOM, output flood) is never an
exception: it is an observation, an `ExecResult` with a `status`, that becomes feedback
and reward. Nothing the candidate does can raise an `InfraError`.
"""

from __future__ import annotations


class TrialboxError(Exception):
    """Root of every error trialbox raises on purpose."""


class UsageError(TrialboxError, ValueError):
    """The caller asked for something invalid; the message says what to change."""


class LimitsError(UsageError):
    """A resource limit is out of range or inconsistent."""


class UnknownLanguage(UsageError):
    """No runner is registered for the requested language."""


class InfraError(TrialboxError):
    """The machinery failed, not the candidate. Retry; if it persists, exclude the sample."""


class SandboxUnavailable(InfraError):
    """This host cannot provide the requested isolation tier (missing kernel feature,
    not root, cgroups absent). The message names what is missing."""


class SandboxStartError(InfraError):
    """A sandbox could not be created or prepared before the candidate ran."""


class ZygoteDied(InfraError):
    """The warm fork server exited; runs in flight are reported as `infra`."""
