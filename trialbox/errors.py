"""The exception tree. Three kinds of failure, never confused (DESIGN.md decision 1).

    TrialboxError
    ├── UsageError            the *caller* misused the API: fix the call (raised at once)
    │   ├── LimitsError       a Limits field is out of range
    │   ├── UnknownLanguage   no runner for the requested language
    │   ├── schedule.lifecycle.IllegalTransition   a task state change the machine forbids
    │   ├── schedule.queues.QueueFull              past the scheduler's waiting-room bound
    │   ├── service.errors.NotFound                no such session / submission
    │   ├── service.errors.FieldError              a request field is unusable (names it)
    │   ├── service.errors.ClientLimit             this client holds as many sessions as one
    │   │                   client may (429): close some; others still can
    │   ├── store.harbor.HarborError  a Harbor task directory is malformed (names the
    │   │                   file and the field)
    │   ├── cluster.placement.TierUnavailable      no cluster node offers the tier asked for
    │   ├── cluster.backend.ClusterUnreachable     no Ray cluster (or too few nodes) at --address
    │   ├── versions.VersionMismatch               a node runs other Python/Ray/trialbox code
    │   ├── cluster.backend.NodeStartFailed        a live node's actor could not start (its
    │   │                   pools, its workloads): the node is misconfigured
    │   ├── sandbox.mounts.PathObstructed  a workspace path is in the way (a directory
    │   │                   where a file goes): in a session, the candidate's doing, so
    │   │                   run_code and the agent turn it into its outcome
    │   ├── sandbox.mounts.WorkspaceFull   a write does not fit in Limits.disk_mb
    │   └── sandbox.image.ImageSpecError   an image spec (or lock) cannot be built as
    │                       written: names the package or field to change
    ├── InfraError            the *infrastructure* failed: retry; if it persists,
    │   │                     exclude the sample (reward None, never 0.0)
    │   ├── SandboxUnavailable  this host cannot provide the requested tier
    │   │   ├── sandbox.native.NativeUnavailable  the cells' C hot path cannot be built
    │   │   │                                     here (the pool falls back to Python)
    │   │   └── sandbox.image.ImageMismatch  an image is not its baseline (files named):
    │   │                       not used, no task runs on it until it is rebuilt
    │   ├── SandboxStartError   a sandbox could not be started or set up
    │   ├── ZygoteDied          the warm fork server died
    │   ├── store.journal.JournalError  the journal cannot be written or read
    │   ├── NodeLost            the node running the work died or was cut off:
    │   │                   retried elsewhere; its late answer is discarded
    │   ├── cluster.channel.ChannelClosed  the connection to a node broke (its process
    │   │                       died, the network cut it): the node is treated as lost
    │   ├── cluster.placement.NoNodeForTier  every node of the tier is gone and none
    │   │                       joined within orphan_wait_s: the work was not run
    │   ├── rollout.fleet.GenerationUnavailable  every policy server is lost and none
    │   │                       was started again in time
    │   ├── rollout.fleet.WeightsMissing  a policy server was asked for weights it does
    │   │                       not hold (never answered with other weights)
    │   └── train.pipeline.StalenessError  a batch past the staleness bound reached the
    │                       trainer: our producer broke its own rule
    ├── service.e2b.E2BError  one of the three, rendered in E2B's error shape for its SDK
    │                       (`{"code", "message"}`): the HTTP status says which (4xx the
    │                       caller's, 503 capacity or infrastructure, 501 not served)
    └── Unavailable           the work cannot be taken *now* (capacity, a deadline): try
        │                     again later; neither the caller's mistake nor broken machinery
        ├── service.admission.Overloaded       no slot free (503 + Retry-After)
        ├── service.admission.RequestAborted   the request went away (client gone,
        │                     shutdown) while its task waited or held a slot: the
        │                     task ends FAILED, never with a reward
        └── service.errors.DeadlineExpired     the request's deadline passed (504)

    CandidateFault            not a TrialboxError: an internal signal that what the
    │                         *candidate* gave cannot be used; caught where it is raised
    │                         and turned into the candidate's outcome, never escapes
    ├── store.patches.TreeError   the answer cannot become a file tree (bad patch/path)
    ├── judge.repo_snapshot.WorkspaceUnwritable  the answer's tree does not fit its
    │                             session's workspace (disk_mb, inodes): graded FAILED
    └── sandbox.cgroups.OverBudget  the session already holds more memory than a run may
                                  start with (its `memory` status, not started)

What the *candidate* did (wrong answer, crash, timeout, OOM, output flood) is never an
exception that leaves the judge: it is an observation, an `ExecResult` with a `status`,
that becomes feedback and reward. Nothing the candidate does can raise an `InfraError`.

Exceptions private to one module (a leading underscore) and those of the standalone
programs that run inside sandboxes (zygote.py, harness_program.py, candidate_stub.py,
repo_plugin.py, service/jupyter_driver.py, and codec.py, which the sandbox's stub
imports: its CodecError is a ValueError) are not part of the tree.
tests/test_errors_tree.py checks that every other exception class is drawn here and
parented as drawn.
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


class NodeLost(InfraError):
    """The node running this work died, was cut off or stopped answering: the work is
    retried elsewhere; whatever that node still says about it is discarded. Defined
    here, not in `cluster/`, because the layers below the cluster (the agent loop, the
    service) catch it without importing the Ray backend."""


class SandboxUnavailable(InfraError):
    """This host cannot provide the requested isolation tier (missing kernel feature,
    not root, cgroups absent). The message names what is missing."""


class SandboxStartError(InfraError):
    """A sandbox could not be created or prepared before the candidate ran."""


class ZygoteDied(InfraError):
    """The warm fork server exited; runs in flight are reported as `infra`."""


class Unavailable(TrialboxError):
    """The work cannot be taken now (no capacity, a deadline passed): try again later.
    Neither the caller's mistake nor broken machinery; nothing was graded."""


class CandidateFault(Exception):
    """What the candidate gave cannot be used (e.g. a patch that does not apply). Raised
    and caught inside the judge and turned into the candidate's outcome; deliberately not
    a TrialboxError, so no `except TrialboxError` can mistake it for ours."""
