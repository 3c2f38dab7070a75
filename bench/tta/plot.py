#!/usr/bin/python3
"""The metric vs training wall-clock time per environment from tta.py's CSVs (tta.py calls
plot_tta): one panel per environment, one colour per configuration, one line per seed.

  plot.py --curve results/tta_curve.csv --summary results/tta_summary.csv --out results/tta.png
"""

import argparse
import csv
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tta import CONFIGS as LABELS  # noqa: E402  (this folder: the configurations' names)

YLABEL = {"digits": "test accuracy (%)", "charlm": "validation loss (nats)"}


def plot_tta(curve_rows, summary_rows, path, target=None):
    envs = list(OrderedDict.fromkeys(r["env"] for r in curve_rows))
    configs = list(OrderedDict.fromkeys(r["config"] for r in curve_rows))
    workload = curve_rows[0]["workload"] if curve_rows else "digits"
    colors = {c: "C%d" % i for i, c in enumerate(configs)}
    fig, axes = plt.subplots(1, max(1, len(envs)), figsize=(4.6 * max(1, len(envs)), 3.4),
                             sharey=True, squeeze=False)
    values = [float(r["metric"]) for r in curve_rows]
    for ax, env in zip(axes[0], envs):
        for config in configs:
            seeds = list(OrderedDict.fromkeys(r["seed"] for r in curve_rows
                                              if r["env"] == env and r["config"] == config))
            for i, seed in enumerate(seeds):
                pts = [(float(r["wall_s"]), float(r["metric"])) for r in curve_rows
                       if r["env"] == env and r["config"] == config and r["seed"] == seed]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2.5,
                        linewidth=1.1, color=colors[config], alpha=0.85,
                        label=LABELS.get(config, config) if i == 0 else None)
        row = next((s for s in summary_rows if s["env"] == env and s["config"] == "ring"), None)
        title = env
        if row is not None:
            title += "  (straggler %s, loss %g%s)" % (
                row["straggler"], 100 * float(row["loss"]),
                "%%, %s bg jobs" % row["bg_jobs"] if int(row.get("bg_jobs") or 0) else "%")
        ax.set_title(title, fontsize=8)
        if target is not None:
            ax.axhline(float(target), color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("training wall-clock (s)", fontsize=8)
        if workload == "digits":
            ax.set_ylim(max(0.0, min(50.0, min(values + [100.0]) - 5)), 100)
        elif values:
            # Skip the first evaluations' high losses: the comparison is near the target.
            lo = min(values + ([float(target)] if target is not None else []))
            ax.set_ylim(lo - 0.05, min(max(values), lo + 1.5))
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(YLABEL.get(workload, "metric"), fontsize=8)
    axes[0][-1].legend(fontsize=7, loc="lower right" if workload == "digits" else "upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curve", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", type=float, default=None)
    a = ap.parse_args()
    summary = _read(a.summary)
    target = a.target if a.target is not None else (float(summary[0]["target"]) if summary else None)
    print(plot_tta(_read(a.curve), summary, a.out, target))


if __name__ == "__main__":
    main()
