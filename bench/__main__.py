"""``python -m bench`` (``make bench``): rsd beside Redis and beanstalkd, in one run.

Runs every step of ``bench.steps`` (or those named by --only) --repeat times, each on a
fresh rsd and, where one applies, a fresh peer with matched durability; prints one
progress line per step on stderr, then a table of medians with the ratio of rsd to each
peer and the command that reproduces each figure; writes every run and the medians to
--json, and a PNG chart next to it.

    python -m bench [--quick] [--repeat N] [--json PATH] [--no-peers] [--only a,b]
                    [--seconds S] [--no-chart] [--kills N]

``cluster`` (a three-node cluster beside a single rsd: throughput, takeovers, replication
lag; needs etcd, about 3 minutes) runs only when named: ``--only cluster``, once unless
--repeat is given.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.chart import write_chart
from bench.figures import Figure, median_figures, number, table
from bench.peers import find_peers
from bench.steps import OPT_IN, STEPS, Context


def say(line: str) -> None:
    """A progress line on stderr (stdout is for the table)."""
    print(line, file=sys.stderr, flush=True)


def _summary(figures: list[Figure]) -> str:
    parts = []
    for fig in figures[:3]:
        peers = ", ".join(f"{peer} {number(value)} ({fig.rsd / value:.2f}x)"
                          for peer, value in fig.peers.items() if value)
        parts.append(f"{fig.key} {number(fig.rsd)} {fig.unit}"
                     + (f" vs {peers}" if peers else ""))
    return "; ".join(parts) + (" ..." if len(figures) > 3 else "")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="one run, short measurements, small state: under a minute")
    parser.add_argument("--repeat", type=int, help="runs of every step (default 3; 1 quick)")
    parser.add_argument("--seconds", type=float,
                        help="time per throughput measurement (default 3; 0.5 quick)")
    parser.add_argument("--json", type=Path, help="write every run and the medians here; "
                        "the chart goes next to it (same name, .png)")
    parser.add_argument("--no-chart", action="store_true", help="no PNG")
    parser.add_argument("--no-peers", action="store_true", help="rsd only")
    parser.add_argument("--only", help="comma-separated steps: " + ", ".join(STEPS)
                        + f" ({', '.join(sorted(OPT_IN))} only when named)")
    parser.add_argument("--kills", type=int,
                        help="the cluster step's kills of its primary (default 20; 3 quick)")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else [s for s in STEPS if s not in OPT_IN]
    args.repeat = args.repeat or (1 if args.quick or set(names) <= OPT_IN else 3)
    args.seconds = args.seconds or (0.5 if args.quick else 3.0)
    unknown = [name for name in names if name not in STEPS]
    if unknown or args.repeat < 1 or args.seconds <= 0 or (args.kills or 0) < 0:
        parser.error(f"unknown step(s) {unknown}; steps: {', '.join(STEPS)}" if unknown
                     else "--repeat must be >= 1, --seconds > 0 and --kills >= 0")
    args.steps = names
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # The cluster step measures rsd beside itself: no peer to look for (or install).
    peers = {} if args.no_peers or set(args.steps) <= OPT_IN else find_peers(say)
    ctx = Context(args.seconds, args.quick, peers, args.kills)
    started = time.monotonic()
    runs: list[list[Figure]] = []
    total = args.repeat * len(args.steps)
    for r in range(args.repeat):
        figures: list[Figure] = []
        for i, name in enumerate(args.steps):
            done = r * len(args.steps) + i + 1
            say(f"[{time.monotonic() - started:6.1f} s] run {r + 1}/{args.repeat}, step "
                f"{done}/{total}: {name} ...")
            got = await STEPS[name](ctx)
            say(f"[{time.monotonic() - started:6.1f} s]   {_summary(got)}")
            figures += got
        runs.append(figures)
    medians = median_figures(runs)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "args": {"quick": args.quick, "repeat": args.repeat, "seconds": args.seconds,
                 "steps": args.steps, "peers": sorted(peers)},
        "took_seconds": time.monotonic() - started,
        "medians": [fig.as_json() for fig in medians],
        "runs": [[fig.as_json() for fig in figs] for figs in runs],
        "_figures": medians,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        import uvloop

        result = uvloop.run(run(args))
    except ImportError:
        result = asyncio.run(run(args))
    figures: list[Figure] = result.pop("_figures")
    load = ", ".join(f"{x:.1f}" for x in result["machine"]["load_average_at_end"])
    print(f"rsd bench, {result['date']}, {result['machine']['cpus']} CPUs (load average "
          f"{load} at the end), medians of {args.repeat} run(s) of {args.seconds:g} s per "
          f"measurement, took {result['took_seconds']:.0f} s")
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"\nJSON: {args.json}")
        if not args.no_chart:
            png = args.json.with_suffix(".png")
            title = f"rsd beside its peers, {result['date'][:10]}, medians of {args.repeat}"
            if write_chart(figures, png, title):
                print(f"chart: {png}")
            else:
                say("no chart: matplotlib is missing (pip install '.[bench]')")


if __name__ == "__main__":
    main()
