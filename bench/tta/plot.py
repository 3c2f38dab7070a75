#!/usr/bin/python3
"""Accuracy vs wall-clock time per environment from tta.py's CSVs (tta.py calls plot_tta).

  plot.py --curve results/tta_curve.csv --summary results/tta_summary.csv --out results/tta.png
"""

import argparse
import csv
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tta import CONFIGS as LABELS  # noqa: E402  (this folder: the configurations' names)


def plot_tta(curve_rows, summary_rows, path, target=None):
    envs = list(OrderedDict.fromkeys(r["env"] for r in curve_rows))
    configs = list(OrderedDict.fromkeys(r["config"] for r in curve_rows))
    fig, axes = plt.subplots(1, max(1, len(envs)), figsize=(4.6 * max(1, len(envs)), 3.4),
                             sharey=True, squeeze=False)
    for ax, env in zip(axes[0], envs):
        for config in configs:
            pts = [(float(r["wall_s"]), float(r["accuracy"])) for r in curve_rows
                   if r["env"] == env and r["config"] == config]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                        linewidth=1.3, label=LABELS.get(config, config))
        ratio = next((s for s in summary_rows if s["env"] == env and s["config"] == "ring"), None)
        title = env
        if ratio is not None:
            title += "  (straggler %s, ring p99/p50 %.2f)" % (ratio["straggler"],
                                                               float(ratio["sync_p99_over_p50"]))
        ax.set_title(title, fontsize=8)
        if target:
            ax.axhline(float(target), color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("training wall-clock (s)", fontsize=8)
        lowest = min([float(r["accuracy"]) for r in curve_rows] + [100.0])
        ax.set_ylim(max(0.0, min(50.0, lowest - 5)), 100)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%)", fontsize=8)
    axes[0][-1].legend(fontsize=7, loc="lower right")
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
