"""bench/report.py: the shape every benchmark reports in — the table, then the results
as one compact JSON line (the last of stdout), the same results indented in --out, and
figures without data as null."""

from __future__ import annotations

import argparse
import json
import math

from trialbox.bench import report


def test_emit_prints_the_table_to_stderr_and_one_json_line_and_writes_out(tmp_path,
                                                                         capsys) -> None:
    out = tmp_path / "r.json"
    p = argparse.ArgumentParser()
    report.add_output_arguments(p)
    args = p.parse_args(["--json", "--out", str(out)])
    res = {"rate": 1.23456789, "none": math.nan, "inf": math.inf, "xs": [0.5, math.nan],
           "obj": object, "n": 3}
    written = report.emit(res, args, "TABLE\nrow", nd=3)
    captured = capsys.readouterr()
    lines = captured.out.splitlines()  # --json: stdout is the JSON line only (| jq works)
    assert captured.err.splitlines() == ["TABLE", "row"] and len(lines) == 1
    assert json.loads(lines[-1]) == written == json.loads(out.read_text())
    assert written["rate"] == 1.235 and written["none"] is None and written["inf"] is None
    assert written["xs"] == [0.5, None] and written["n"] == 3
    assert written["obj"] == str(object)
    assert out.read_text().startswith("{\n  ")  # indented for people


def test_without_json_only_the_table(tmp_path, capsys) -> None:
    report.emit({"a": 1}, argparse.Namespace(json=False, out=None), "T")
    assert capsys.readouterr().out == "T\n"


def test_figures() -> None:
    assert report.median([3.0, 1.0, 2.0, 4.0]) == 2.5
    assert math.isnan(report.median([]))
    assert report.rounded(2.0 / 3, 2) == 0.67 and report.rounded(math.nan) is None
    assert report.rounded(None) is None and report.rounded(7) == 7
    assert report.ratio(3.0, 2.0) == 1.5 and math.isnan(report.ratio(1.0, 0.0))
    assert report.fmt(None) == "-" and report.fmt(1.0, 1) == "1.0"
    assert report.met(True) == "MET" and report.met(False, "NOT MET") == "NOT MET"
    assert report.met(None) == "NOT MEASURED" and report.fmt_x(1.5) == "1.50x"
    m = report.machine_info()
    assert m["nproc"] >= 1 and len(m["loadavg_start"]) == 3
    assert report.load_average() >= 0
