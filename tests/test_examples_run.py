"""Every program in ``examples/`` runs against a real rsd and says what it should.

They run at once, as separate processes (each makes its own run), given the server's
address in ``$RUNSTATE_ADDRESS`` as ``make run`` users do.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from support.process import REPO, subprocess_env

EXPECTED = {
    "approval_agent.py": ["progress: {'step': 'greeting', 'done': 1, 'of': 3}",
                          "state: WAITING (attempt 0)", "approval sent, woken: True",
                          "state: RUNNING (attempt 1)", "progress: {'step': 'sending'}",
                          "outcome: SUCCEEDED {'sent': True, 'by': 'dana'}"],
    "claims.py": ["researching acme as generation", "rival refused: CLAIM_HELD",
                  "rival's try_acquire: busy", "with fencing token"],
    "shared_task.py": ["planner-0 got", "planner-2 got", "the work was done 1 time(s)"],
    "crash_takeover.py": ["steady got attempt 2", "late result refused: STALE_CLAIM",
                          "recorded: SUCCEEDED steady's report"],
    "manual_receive.py": ["the queue is now empty: True", "result: {'summary'"],
    "plain_messages.py": [" False", " True", "same work_key: IDEMPOTENCY_CONFLICT",
                          "received message"],
    "sync_worker.py": ["acme, gen", "umbrella, gen"],
    "research_plan.py": ["plan: {'searches': 3}", "children of the plan: 4",
                         "summary: notes on competitors + notes on hiring + notes on pricing",
                         "a cancelled plan's search: True"],
    "fencing_sqlite.py": ["old owner writes: True", "new owner writes: True",
                          "old token current: False", "new token current: True",
                          "late write from the old owner: False", "stored: final"],
    "fencing_files.py": ["old owner writes: True", "new owner writes: True",
                         "late write from the old owner: False", "old token current: False",
                         "file holds: final"],
}


def test_every_example_runs_against_a_real_rsd(rsd: Any) -> None:
    examples = sorted(path.name for path in (REPO / "examples").glob("*.py"))
    assert examples == sorted(EXPECTED), "an example without expectations, or one missing"
    env = {**subprocess_env(), "RUNSTATE_ADDRESS": rsd.address}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(REPO / "examples" / name)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in examples
    }
    failures = []
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        missing = [line for line in EXPECTED[name] if line not in out]
        if proc.returncode != 0 or missing:
            failures.append(f"{name}: exit {proc.returncode}, missing {missing}:\n{out}")
    assert not failures, "\n\n".join(failures)
