"""The hostile battery on every tier: test_hostile.py runs it on the namespace tier,
oci_cases.py on `container` (runc and crun: test_container.py) and `gvisor`
(test_gvisor.py), with the same programs (RESOURCE_ATTACKS, PRIVILEGED, SECRET, PROJECT
are imported from test_hostile.py) and the same statuses (one documented exception,
oci_cases.STATUS_OVERRIDES); each OCI provider is checked to leave no container,
runtime state, cgroup, mount or process once the battery has run (OciHarness.close).

This module keeps the two lists from drifting apart: a case added to test_hostile.py
without its OCI counterpart (or a stated reason) fails here.
"""

from __future__ import annotations

import ast
import os

from tests.sandbox.oci_cases import STATUS_OVERRIDES
from tests.sandbox.test_hostile import RESOURCE_ATTACKS

HERE = os.path.dirname(os.path.abspath(__file__))

COUNTERPART = {
    "test_resource_attack_contained": ["test_resource_attack_contained"],
    "test_fork_bomb_hits_the_pids_limit": ["test_fork_bomb_hits_the_process_limit"],
    "test_no_route_to_host_loopback_listener": ["test_network_off",
                                                "test_no_route_to_a_host_abstract_socket"],
    # only `lo` exists in the sandbox, checked by test_network_off: no route anywhere
    # (no connection to an outside address is attempted from the OCI tiers' tests)
    "test_no_external_network": ["test_network_off"],
    "test_host_files_not_visible": ["test_host_files_and_project_not_visible"],
    "test_project_path_not_revealed": ["test_host_files_and_project_not_visible"],
    "test_parent_environment_not_visible": ["test_parent_environment_not_visible"],
    "test_host_processes_not_visible": ["test_host_processes_not_visible"],
    "test_writes_outside_workspace_fail": ["test_writes_outside_workspace_fail"],
    "test_leftovers_do_not_reach_the_next_session":
        ["test_leftovers_do_not_reach_the_next_session"],
    "test_kill_everything_spares_the_host": ["test_kill_everything_spares_the_host"],
    "test_ptrace_denied": ["test_ptrace_denied"],
    "test_privileged_syscalls_fail_with_eperm": ["test_privileged_syscalls_fail"],
    "test_identity_without_privilege": ["test_identity_without_privilege"],
    "test_setuid_binaries_do_not_escalate": ["test_setuid_binaries_do_not_escalate"],
    "test_double_forked_daemon_dies_with_the_run": ["test_daemon_dies_with_the_run"],
    "test_cgroup_and_kernel_interfaces_hidden": ["test_cgroup_and_kernel_interfaces_hidden"],
    "test_protocol_lookalike_output_changes_nothing":
        ["test_protocol_lookalike_output_changes_nothing"],
}


def _tests(name: str) -> set[str]:
    with open(os.path.join(HERE, name)) as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name.startswith("test_")}


def test_every_hostile_case_runs_on_every_tier() -> None:
    hostile, oci = _tests("test_hostile.py"), _tests("oci_cases.py")
    assert hostile == set(COUNTERPART), (
        f"test_hostile.py cases without an entry here: {sorted(hostile - set(COUNTERPART))}"
        f"; entries for cases no longer there: {sorted(set(COUNTERPART) - hostile)}")
    missing = {h: o for h, os_ in COUNTERPART.items() for o in os_ if o not in oci}
    assert not missing, f"no such case in oci_cases.py: {missing}"


def test_statuses_differ_only_where_documented() -> None:
    ids = {a[0] for a in RESOURCE_ATTACKS}
    assert {case for _tier, case in STATUS_OVERRIDES} <= ids
    assert set(STATUS_OVERRIDES) == {("gvisor", "fork-bomb-python")}, STATUS_OVERRIDES
