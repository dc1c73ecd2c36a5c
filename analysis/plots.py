"""PNG plots of a built report: lift per problem, a forest plot of ΔGM, and standing bars.

Plots read the report dict of `metakernel.analysis.report.build_report`, never the attempt table, so every drawn
number is one the tables print. Rendering is deterministic (Agg backend, matplotlib's default style whatever the
user's rc file says, fixed sizes and DPI, no timestamps in the PNG metadata): the same report gives the same bytes
with the same matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["PLOTS", "plot_forest", "plot_lift_per_problem", "plot_standing", "write_plots"]

#: File stem -> title; `write_plots` writes ``<stem>.png`` for each.
PLOTS = {
    "lift_per_problem": "Lift per problem",
    "forest_dgm": "ΔGM per model x direction (forest plot)",
    "standing_bars": "Relative standing: independent vs naive",
}
_DPI = 100
#: Lifts labelled on the forest plot's log axis (those inside the drawn range).
_FOREST_TICKS = (-0.95, -0.9, -0.75, -0.5, -0.25, 0.0, 0.5, 1.0, 2.0, 4.0, 9.0, 19.0, 49.0)
_GREEN, _RED, _GREY, _BLUE, _ORANGE = "#2e7d32", "#c62828", "#9e9e9e", "#1565c0", "#ef6c00"


def _cells(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(r["model"], r["direction"]) for r in report["tables"].get("headline", {}).get("records", [])]


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=_GREY)
    ax.set_xticks([])
    ax.set_yticks([])


def _synthetic_mark(fig: Figure, report: Mapping[str, Any]) -> None:
    if report.get("synthetic"):
        fig.text(0.5, 0.995, "SYNTHETIC DATA: generated, not measured", ha="center", va="top", color=_RED,
                 fontsize=11, fontweight="bold")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=_DPI, format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def plot_lift_per_problem(report: Mapping[str, Any], path: Path) -> Path:
    """Bars of each problem's mean log ratio per model x direction, sorted, with the cell's mean as a line.

    Sorting shows whether a lift is broad or carried by a few problems; the log scale keeps help and harm
    symmetric (a doubling and a halving have the same bar height).
    """
    cells = _cells(report)
    rows = report["tables"].get("problem_lift", {}).get("records", [])
    models = sorted({m for m, _ in cells}) or ["(no model)"]
    directions = sorted({d for _, d in cells}) or ["(no direction)"]
    fig, axes = plt.subplots(len(models), len(directions), figsize=(6.0 * len(directions), 3.2 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, direction in enumerate(directions):
            ax = axes[i][j]
            mine = sorted((r for r in rows if r["model"] == model and r["direction"] == direction),
                          key=lambda r: (-r["mean_log_ratio"], r["problem"]))
            ax.set_title(f"{model} — {direction} (n = {len(mine)} problems)", fontsize=10)
            if not mine:
                _empty(ax, "no pairs")
                continue
            values = [r["mean_log_ratio"] for r in mine]
            ax.bar(range(len(mine)), values, color=[_GREEN if v > 0 else _RED if v < 0 else _GREY for v in values])
            ax.axhline(0.0, color="black", linewidth=0.8)
            mean = sum(values) / len(values)
            ax.axhline(mean, color=_BLUE, linestyle="--", linewidth=1.0,
                       label=f"mean (ΔGM {100 * math.expm1(mean):+.1f} %)")
            ax.set_xticks(range(len(mine)))
            ax.set_xticklabels([str(r["problem"]) for r in mine], fontsize=6, rotation=90)
            ax.set_xlabel("problem (sorted by lift)", fontsize=8)
            ax.set_ylabel("mean log(c_skill / c_solo)", fontsize=8)
            ax.legend(fontsize=7, loc="upper right")
    _synthetic_mark(fig, report)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, path)


def plot_forest(report: Mapping[str, Any], path: Path) -> Path:
    """ΔGM of every model x direction cell with its interval; cells without an interval say why.

    The x axis is the log ratio scale labelled in percent, so intervals that are symmetric in log space look it.
    """
    records = report["tables"].get("headline", {}).get("records", [])
    fig, ax = plt.subplots(figsize=(7.5, 1.0 + 0.55 * max(1, len(records))))
    if not records:
        _empty(ax, "no model x direction cells")
    labels = []
    for y, r in enumerate(reversed(records)):
        labels.append(f"{r['model']} {r['direction']}\n(n = {r['n_problems']} problems)")
        if r["dgm"] is None:
            ax.text(0.0, y, "no pairs", va="center", ha="center", color=_GREY, fontsize=8)
            continue
        x = math.log1p(r["dgm"])
        if r["ci_low"] is not None and r["ci_high"] is not None:
            low, high = math.log1p(r["ci_low"]), math.log1p(r["ci_high"])
            ax.errorbar([x], [y], xerr=[[x - low], [high - x]], fmt="o", color=_BLUE, capsize=4)
            p = r["p_holm"]
            text = f"{100 * r['dgm']:+.1f} %" + (f", p(Holm) {p:.3g}" if p is not None else "")
        else:
            ax.plot([x], [y], "o", markerfacecolor="white", color=_BLUE)
            text = f"{100 * r['dgm']:+.1f} % (no CI: n too small)"
        ax.annotate(text, (x, y), xytext=(0, 8), textcoords="offset points", ha="center", fontsize=7)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.7, max(0.7, len(labels) - 0.3))
    low, high = ax.get_xlim()
    ticks = [math.log1p(g) for g in _FOREST_TICKS if low <= math.log1p(g) <= high]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{100 * math.expm1(t):+.0f} %" for t in ticks], fontsize=8)
    ax.set_xlim(low, high)
    ax.set_xlabel("ΔGM (log scale), 95 % bootstrap CI", fontsize=9)
    ax.set_title("Paired lift per model x direction", fontsize=10)
    _synthetic_mark(fig, report)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return _save(fig, path)


def plot_standing(report: Mapping[str, Any], path: Path) -> Path:
    """Net help rate (help - harm over informative pairs) by source standing, independent next to naive.

    Side by side, the naive bars' slope from "above" to "below" is the regression-to-the-mean artefact the
    independent bars are free of.
    """
    tables = report["tables"]
    cells = _cells(report)
    fig, axes = plt.subplots(1, max(1, len(cells)), figsize=(3.6 * max(1, len(cells)), 3.4), squeeze=False)
    if not cells:
        _empty(axes[0][0], "no model x direction cells")
    standings = ("above", "same", "below")
    for ax, (model, direction) in zip(axes[0], cells, strict=False):
        ax.set_title(f"{model} — {direction}", fontsize=9)
        labelled: set[str] = set()
        for k, (name, color) in enumerate((("independent", _BLUE), ("naive", _ORANGE))):
            rows = {r["standing"]: r for r in tables.get(f"standing_{name}", {}).get("records", [])
                    if r["model"] == model and r["direction"] == direction}
            for s_i, standing in enumerate(standings):
                r = rows.get(standing)
                x = s_i + (k - 0.5) * 0.38
                if r is None or r["help_rate"] is None or r["harm_rate"] is None:
                    ax.text(x, 0.0, "n/a", ha="center", va="bottom", fontsize=6, color=_GREY)
                    continue
                value = r["help_rate"] - r["harm_rate"]
                ax.bar([x], [value], width=0.36, color=color, label=None if name in labelled else name)
                labelled.add(name)
                ax.text(x, value, f"n={r['n_informative']}", ha="center", va="bottom" if value >= 0 else "top",
                        fontsize=6)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(standings)))
        ax.set_xticklabels([f"source {s}" for s in standings], fontsize=7)
        ax.set_ylim(-1.2, 1.2)  # room for the n= labels of bars at +-1
        ax.set_ylabel("help rate - harm rate (informative)", fontsize=7)
    # One legend for the figure, above the panels: inside a panel it covered the bars near +1.
    unique: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            unique.setdefault(label, handle)
    if unique:
        fig.legend(list(unique.values()), list(unique.keys()), fontsize=7, loc="upper left", ncol=2, frameon=False)
    _synthetic_mark(fig, report)
    fig.tight_layout(rect=(0, 0, 1, 0.90))
    return _save(fig, path)


def write_plots(report: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write every plot into ``out_dir`` and return stem -> path, in `PLOTS` order.

    Drawn under matplotlib's default style so a user's matplotlibrc cannot change the files.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawers = {"lift_per_problem": plot_lift_per_problem, "forest_dgm": plot_forest, "standing_bars": plot_standing}
    paths: dict[str, Path] = {}
    with matplotlib.rc_context(), plt.style.context("default"):
        matplotlib.rcParams["svg.hashsalt"] = "metakernel"
        for stem in PLOTS:
            paths[stem] = drawers[stem](report, out / f"{stem}.png")
    return paths
