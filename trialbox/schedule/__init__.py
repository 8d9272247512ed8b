"""The scheduler: task lifecycle, queues, quotas, leases and crash-safe records.

lease.py holds the seam the agent loop leases sandboxes through (`Leaser`)."""
