"""Running the same scheduler across machines on Ray (`pip install trialbox[ray]`).

`placement.py` (pure: nodes, slots, affinity, fencing), `node.py` (what runs on each
machine: its sandbox providers and the workloads), `backend.py` (Ray: node actors,
membership, health), `sessions.py` (an episode's sandbox session on a node, the `Sandbox`
interface on the driver), `evaljob.py` (`trialbox eval --backend ray`). Only
`backend.py` and what imports it need Ray; importing this package does not.
"""
