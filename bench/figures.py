"""Figures of a bench run: one value for rsd and one per peer, gathered over repeated
runs and reduced to medians, with the ratio of rsd to each peer, as a table and as JSON.

A ratio is always rsd's value divided by the peer's; ``better`` says which way is good
(``higher`` for rates, ``lower`` for latencies, times and memory). Over repeated runs the
ratio is the median of each run's own ratio: rsd and its peer are measured back to back,
so on a machine whose speed drifts (a shared one) the pair is fairer than two medians
taken at different moments.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Figure", "median_figures", "number", "table"]


@dataclass
class Figure:
    """One measured quantity: rsd's value and the same quantity for each peer."""

    key: str
    what: str
    unit: str
    command: str
    rsd: float
    peers: dict[str, float] = field(default_factory=dict)
    better: str = "higher"
    extra: dict[str, float] = field(default_factory=dict)
    runs: int = 1
    spread: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)

    def ratio(self, peer: str) -> float | None:
        """rsd / peer: the median of the runs' ratios once merged, else this run's."""
        if peer in self.ratios:
            return self.ratios[peer]
        value = self.peers.get(peer)
        return self.rsd / value if value else None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratios"] = {peer: self.ratio(peer) for peer in self.peers}
        return out


def median_figures(runs: list[list[Figure]]) -> list[Figure]:
    """Per key (in first-seen order), the median of every value over the runs that have it,
    and each value's range (min, max) in ``spread``."""
    by_key: dict[str, list[Figure]] = {}
    for run in runs:
        for fig in run:
            by_key.setdefault(fig.key, []).append(fig)
    merged: list[Figure] = []
    for figs in by_key.values():
        first = figs[0]
        rsd_values = [f.rsd for f in figs]
        spread = {"rsd": [min(rsd_values), max(rsd_values)]}
        peers: dict[str, float] = {}
        ratios: dict[str, float] = {}
        for peer in first.peers:
            values = [f.peers[peer] for f in figs if peer in f.peers]
            peers[peer] = statistics.median(values)
            spread[peer] = [min(values), max(values)]
            paired = [f.rsd / f.peers[peer] for f in figs if f.peers.get(peer)]
            if paired:
                ratios[peer] = statistics.median(paired)
                spread[f"ratio {peer}"] = [min(paired), max(paired)]
        extra = {name: statistics.median([f.extra[name] for f in figs if name in f.extra])
                 for name in first.extra}
        merged.append(Figure(first.key, first.what, first.unit, first.command,
                             statistics.median(rsd_values), peers, first.better, extra,
                             len(figs), spread, ratios))
    return merged


def number(value: float) -> str:
    """Three significant digits at least, thousands separated."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def table(figures: list[Figure]) -> str:
    """A Markdown table: what, rsd, each peer with the ratio, extras, the command (medians
    when the figures were merged over runs)."""
    lines = ["| what | unit | rsd | peer (ratio rsd/peer) | also | command |",
             "| --- | --- | --- | --- | --- | --- |"]
    for fig in figures:
        peers = "; ".join(
            f"{peer} {number(value)} ({fig.ratio(peer):.2f}x)" if value else f"{peer} -"
            for peer, value in fig.peers.items()
        ) or "-"
        extra = "; ".join(f"{name} {number(value)}" for name, value in fig.extra.items()) or "-"
        unit = fig.unit + (" (lower is better)" if fig.better == "lower" else "")
        lines.append(f"| {fig.what} | {unit} | {number(fig.rsd)} | {peers} | {extra} "
                     f"| `{fig.command}` |")
    return "\n".join(lines)
