"""``python -m bench`` (the harness behind ``make bench``) runs end to end and writes
JSON a reader can rely on: every figure positive and finite, medians over the runs, a
reproducing command per figure, each task row the CPU per task of every process (rsd,
planner, worker), and a refused step name is a usage error, not a crash.

Kept to a few seconds: rsd only (no peers), a few short steps.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from support.process import REPO, subprocess_env

STEPS = "claims-no,tasks-no,handoff,result-latency"


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120, check=False,
                          env=subprocess_env())


def test_quick_run_without_peers_writes_json_with_a_command_per_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = _bench("--quick", "--no-peers", "--only", STEPS, "--seconds", "0.2",
                  "--repeat", "2", "--json", str(out), "--no-chart", cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["args"]["peers"] == [] and result["args"]["repeat"] == 2
    keys = [fig["key"] for fig in result["medians"]]
    assert keys == ["claims.no", "tasks.no", "handoff", "result-latency"]
    assert len(result["runs"]) == 2 and all(len(run) == 4 for run in result["runs"])
    for fig in result["medians"]:
        assert math.isfinite(fig["rsd"]) and fig["rsd"] > 0, fig
        assert fig["runs"] == 2 and fig["peers"] == {}
        low, high = fig["spread"]["rsd"]
        assert low <= fig["rsd"] <= high
        assert fig["command"].startswith("python -m bench --only ")
        assert fig["command"] in done.stdout  # the table names it too
    tasks_row = result["medians"][1]  # every task row carries each process's CPU per task
    for process in ("rsd", "planner", "worker"):
        cost = tasks_row["extra"][f"{process} CPU us/task"]
        assert math.isfinite(cost) and cost > 0, tasks_row["extra"]
        assert f"{process} CPU us/task" in done.stdout
    progress = [line for line in done.stderr.splitlines() if "step " in line]
    assert len(progress) == 8  # one line per step and run


def test_an_unknown_step_is_a_usage_error(tmp_path: Path) -> None:
    done = _bench("--only", "claims-no,nonsense", cwd=REPO)
    assert done.returncode == 2
    assert "nonsense" in done.stderr and "claims-no" in done.stderr


def test_the_ratio_over_runs_is_the_median_of_each_runs_own_ratio() -> None:
    from bench.figures import Figure, median_figures

    def run(rsd: float, redis: float) -> list[Figure]:
        return [Figure("claims.no", "claims", "pairs/s", "cmd", rsd, {"redis": redis})]

    merged = median_figures([run(10, 5), run(30, 30), run(50, 10)])[0]
    assert merged.rsd == 30 and merged.peers == {"redis": 10}
    assert merged.ratio("redis") == 2  # runs' ratios 2, 1, 5: not 30 / 10
    assert merged.spread == {"rsd": [10, 50], "redis": [5, 30], "ratio redis": [1, 5]}
    assert merged.runs == 3
