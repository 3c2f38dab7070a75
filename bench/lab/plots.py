#!/usr/bin/python3
"""Plots of a lab experiment (lab.py experiment writes the CSVs and calls plot_all):

  cdf.png         latency CDF per algorithm, one panel per environment
  tail_ratio.png  p99/p50 per algorithm, grouped by environment
  p99.png         p99 latency per algorithm and environment

  plots.py --samples results/samples.csv --summary results/summary.csv --out results/
"""

import argparse
import csv
import os
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def plot_cdf(samples_rows, path):
    envs = list(OrderedDict.fromkeys(r["env"] for r in samples_rows))
    algos = list(OrderedDict.fromkeys(r["algo"] for r in samples_rows))
    fig, axes = plt.subplots(1, len(envs), figsize=(max(5.5, 3.6 * len(envs)), 3.4), sharey=True,
                             squeeze=False)
    for ax, env in zip(axes[0], envs):
        for algo in algos:
            v = sorted(float(r["us"]) / 1000 for r in samples_rows
                       if r["env"] == env and r["algo"] == algo)
            if not v:
                continue
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=algo, linewidth=1.2)
        ax.set_xscale("log")
        ax.set_title(env, fontsize=9)
        ax.set_xlabel("allreduce time (ms)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("CDF", fontsize=8)
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _grouped_bars(summary_rows, path, series, ylabel, log=False):
    envs = list(OrderedDict.fromkeys(r["env"] for r in summary_rows))
    algos = list(OrderedDict.fromkeys(r["algo"] for r in summary_rows))
    width = 0.8 / max(1, len(algos))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(envs) + 1), 3.0))
    for j, algo in enumerate(algos):
        xs, ys = [], []
        for i, env in enumerate(envs):
            row = next((r for r in summary_rows if r["env"] == env and r["algo"] == algo), None)
            if row is not None:
                xs.append(i + (j - (len(algos) - 1) / 2) * width)
                ys.append(series(row))
        ax.bar(xs, ys, width=width, label=algo)
    ax.set_xticks(range(len(envs)))
    ax.set_xticklabels(envs, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.tick_params(labelsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_all(samples_csv, summary_csv, out_dir):
    samples = _read(samples_csv)
    summary = _read(summary_csv)
    written = []
    if samples:
        p = os.path.join(out_dir, "cdf.png")
        plot_cdf(samples, p)
        written.append(p)
    if summary:
        p = os.path.join(out_dir, "tail_ratio.png")
        _grouped_bars(summary, p, lambda r: float(r["p99_over_p50"]), "p99 / p50")
        written.append(p)
        p = os.path.join(out_dir, "p99.png")
        _grouped_bars(summary, p, lambda r: float(r["p99_us"]) / 1000, "p99 (ms)", log=True)
        written.append(p)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    for p in plot_all(a.samples, a.summary, a.out):
        print(p)


if __name__ == "__main__":
    main()
