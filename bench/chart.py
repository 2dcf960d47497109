"""The PNG beside the JSON: claims throughput by concurrency, p50/p99 latency by
concurrency, and the headline rates, rsd beside the peers (matplotlib, Agg backend, no
display needed). Without matplotlib it says so and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from bench.figures import Figure

__all__ = ["write_chart"]

RSD, PEER = "tab:blue", "tab:orange"


def write_chart(figures: list[Figure], path: Path, title: str) -> bool:
    """Draw ``figures`` into ``path``; False (nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted((int(f.extra["coroutines"]), f) for f in figures
                   if f.key.startswith("concurrency."))
    heads = [f for f in figures if f.key in ("claims.no", "claims.always", "tasks.no",
                                             "tasks.always")]
    fig, (rate_ax, lat_ax, head_ax) = plt.subplots(1, 3, figsize=(16, 5))
    if sweep:
        xs = [c for c, _ in sweep]
        rate_ax.plot(xs, [f.rsd for _, f in sweep], "o-", color=RSD, label="rsd")
        lat_ax.plot(xs, [f.extra["rsd p50 ms"] for _, f in sweep], "o-", color=RSD,
                    label="rsd p50")
        lat_ax.plot(xs, [f.extra["rsd p99 ms"] for _, f in sweep], "o--", color=RSD,
                    label="rsd p99")
        if any("redis" in f.peers for _, f in sweep):
            rate_ax.plot(xs, [f.peers.get("redis", float("nan")) for _, f in sweep], "s-",
                         color=PEER, label="Redis (redis-py)")
            lat_ax.plot(xs, [f.extra.get("redis p50 ms", float("nan")) for _, f in sweep],
                        "s-", color=PEER, label="Redis p50")
            lat_ax.plot(xs, [f.extra.get("redis p99 ms", float("nan")) for _, f in sweep],
                        "s--", color=PEER, label="Redis p99")
        for ax in (rate_ax, lat_ax):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("coroutines on one client")
            ax.legend()
            ax.grid(True, alpha=0.3)
        rate_ax.set_ylabel("acquire+release pairs/s")
        rate_ax.set_title("claims throughput by concurrency (--fsync no)")
        lat_ax.set_yscale("log")
        lat_ax.set_ylabel("ms per acquire+release")
        lat_ax.set_title("claims latency percentiles")
    if heads:
        names = [f.key for f in heads]
        width = 0.4
        at = range(len(heads))
        head_ax.bar([i - width / 2 for i in at], [f.rsd for f in heads], width, color=RSD,
                    label="rsd")
        head_ax.bar([i + width / 2 for i in at],
                    [next(iter(f.peers.values()), 0.0) for f in heads], width, color=PEER,
                    label="peer (Redis for claims, beanstalkd for tasks)")
        head_ax.set_xticks(list(at), names)
        head_ax.set_ylabel("per second")
        head_ax.set_title("claims pairs/s and tasks/s, by durability")
        head_ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
