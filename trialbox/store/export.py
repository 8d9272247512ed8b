"""Export a run's trajectories for reuse as SFT/RL data: JSONL (one task per line) and
Parquet (one row per task; the turns and grade as JSON text, so the schema does not
depend on what a job chose to record in a turn).

    export_run("run.db", "run-1", ArtifactStore("s3://bucket/data"), "jsonl")
"""

from __future__ import annotations

import io
import json
from typing import Any

from trialbox.errors import UsageError
from trialbox.store.artifacts import ArtifactStore
from trialbox.store.records import Records

FORMATS = ("jsonl", "parquet")


def export_run(journal: str, run_id: str, store: ArtifactStore, fmt: str = "jsonl",
               name: str | None = None, only_final: bool = True) -> dict[str, Any]:
    """Write the run's trajectories to `store` as `name` (default `RUN.trajectories.FMT`).
    `only_final`: leave out tasks that have not reached a final state yet. Returns
    {"path", "rows", "format"}."""
    if fmt not in FORMATS:
        raise UsageError(f"export format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    with Records(journal) as rec:
        rows = [r for r in rec.trajectories(run_id)
                if not only_final or r["state"] in ("done", "failed", "timed_out",
                                                    "cancelled")]
    name = name or f"{run_id}.trajectories.{fmt}"
    if fmt == "jsonl":
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        table = pa.table({
            "run_id": pa.array([r["run_id"] for r in rows], pa.string()),
            "task_id": pa.array([r["task_id"] for r in rows], pa.string()),
            "state": pa.array([r["state"] for r in rows], pa.string()),
            "attempt": pa.array([r["attempt"] for r in rows], pa.int32()),
            "reward": pa.array([r["reward"] for r in rows], pa.float64()),
            "n_turns": pa.array([len(r["turns"]) for r in rows], pa.int32()),
            "payload": pa.array([json.dumps(r["payload"]) for r in rows], pa.string()),
            "turns": pa.array([json.dumps(r["turns"]) for r in rows], pa.string()),
            "grade": pa.array([json.dumps(r["grade"]) for r in rows], pa.string()),
        })
        buf = io.BytesIO()
        pq.write_table(table, buf)
        data = buf.getvalue()
    return {"path": store.put(name, data), "rows": len(rows), "format": fmt}
