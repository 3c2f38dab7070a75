#!/usr/bin/python3
"""OptiReduce mode's benchmark (issue #5): p50/p99/p99.9 of Gloo ring_chunked, reliable TAR
and OptiReduce mode, 4 local ranks, in three environments, one run:

  none      no faults
  loss      1% packet loss (seeded, in our transport's I/O layer: Gloo's TCP cannot lose
            packets here, so its row is ring_chunked over our UDP transport, which
            retransmits them)
  straggler one rank sleeps a random delay before each iteration (--straggler DIST); the
            default auto:0.8 draws it from an exponential whose mean is 0.8 x Gloo ring's
            p50 without faults at that size, which makes ring's p99/p50 about 3
            (an Exp(m) delay on a base b gives (b + 4.6 m) / (b + 0.69 m))

  /usr/bin/python3 bench/mode/mode_table.py [--sizes 4194304,16777216] [--iters 100]
      [--straggler auto:0.8 | exp:15 | ...] [--repair-budgets 1,0.25,0] [--csv FILE]

Every run is optireduce-bench --local-ranks 4 with --samples-csv; percentiles are over the
timed iterations of rank 0 (p99.9 needs >= 1000 iterations to differ from the max).
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

ALGOS = [("ring_chunked", "allreduce_ring_chunked"), ("TAR", "transpose"),
         ("OptiReduce", "optireduce")]


def percentile(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    k = min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))
    return v[k]


def run(bench, algo, transport, elements, iters, env_extra, straggler, timeout,
        repair_budget=None):
    with tempfile.TemporaryDirectory() as tmp:
        samples = os.path.join(tmp, "s.csv")
        cmd = [bench, "--local-ranks", "4", "-t", transport, "--elements", str(elements),
               "--iteration-count", str(iters), "--warmup-iters", "25",
               "--samples-csv", samples, "--timeout", "120", algo]
        if repair_budget is not None:
            cmd[1:1] = ["--repair-budget", repair_budget]
        if straggler:
            cmd[1:1] = ["--straggler-ms-dist", straggler]
        env = dict(os.environ, **env_extra)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
        with open(samples) as f:
            rows = list(csv.DictReader(f))
    us = [float(r["us"]) for r in rows]
    loss = [float(r["loss_pct"]) for r in rows]
    damaged = [int(r["damaged"]) for r in rows]
    return us, sum(loss) / max(1, len(loss)), 100.0 * sum(damaged) / max(1, len(damaged))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4194304,16777216",
                    help="float32 elements per buffer, comma-separated (default 16 and 64 MiB)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--straggler", default="auto:0.8",
                    help="delay distribution (ms) of the straggler env, or auto:F (exponential, "
                         "mean F x ring's no-fault p50 at each size)")
    ap.add_argument("--envs", default="none,loss,straggler")
    ap.add_argument("--repair-budgets", default="1",
                    help="OptiReduce rows, one per repair budget (fraction of the bound; "
                         "0 = never repair), comma-separated, e.g. 1,0.25,0")
    ap.add_argument("--csv", default="")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "optireduce-bench"))
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        ap.error(f"--sizes: expected comma-separated integers, got '{args.sizes}'")
    envs = [e for e in args.envs.split(",") if e]
    for e in envs:
        if e not in ("none", "loss", "straggler"):
            ap.error(f"--envs: unknown environment '{e}' (allowed: none, loss, straggler)")
    auto_scale = None
    if args.straggler.startswith("auto:"):
        try:
            auto_scale = float(args.straggler[5:])
        except ValueError:
            auto_scale = -1
        if not auto_scale > 0:
            ap.error(f"--straggler: auto:F needs a positive number F, got '{args.straggler}'")
    budgets = [b for b in args.repair_budgets.split(",") if b]
    for b in budgets:
        try:
            ok = 0 <= float(b) <= 10
        except ValueError:
            ok = False
        if not ok:
            ap.error(f"--repair-budgets: '{b}' is not a fraction of the bound in [0, 10]")
    if not budgets:
        ap.error("--repair-budgets: give at least one budget, e.g. 1")
    algos = [(name, algo, None) for name, algo in ALGOS if algo != "optireduce"]
    algos += [("OptiReduce", "optireduce", b) for b in budgets]
    if not os.access(args.bench, os.X_OK):
        ap.error(f"--bench: '{args.bench}' is not an executable (build it: ./scripts/build.sh)")

    out = []
    ring_p50_none = {}  # elements -> Gloo ring's p50 (ms) without faults, for auto stragglers
    print(f"{'env':10} {'MiB':>4} {'algorithm':28} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
          f"{'p99/p50':>8} {'p99 vs ring':>11} {'loss %':>7} {'damaged %':>9}", flush=True)
    for env in envs:
        for elements in sizes:
            ring_p99 = None
            for name, algo, budget in algos:
                transport = "tcp" if algo == "allreduce_ring_chunked" else "udp"
                extra = {}
                straggler = args.straggler if env == "straggler" else ""
                if env == "straggler" and auto_scale is not None:
                    if elements not in ring_p50_none:
                        us, _, _ = run(args.bench, "allreduce_ring_chunked", "tcp", elements,
                                    args.iters, {}, "", timeout=1800)
                        ring_p50_none[elements] = percentile(us, 0.5) / 1e3
                    straggler = f"exp:{auto_scale * ring_p50_none[elements]:.1f}"
                    if name == algos[0][0]:
                        print(f"# straggler at {elements * 4 // (1 << 20)} MiB: {straggler} ms "
                              f"({auto_scale} x ring's no-fault p50)", flush=True)
                if env == "loss":
                    extra["OPTIREDUCE_FAULTS"] = "drop=0.01,seed=7"
                    transport = "udp"
                label = f"{name} ({transport})"
                if budget is not None and budgets != ["1"]:
                    label = f"{name} ({transport}, repair {budget})"
                us, loss, damaged = run(args.bench, algo, transport, elements, args.iters, extra,
                                        straggler, timeout=1800, repair_budget=budget)
                p50, p99, p999 = (percentile(us, q) / 1e3 for q in (0.5, 0.99, 0.999))
                if ring_p99 is None:
                    ring_p99 = p99
                if env == "none" and algo == "allreduce_ring_chunked":
                    ring_p50_none[elements] = p50
                row = dict(env=env, mib=elements * 4 // (1 << 20), algorithm=label, p50_ms=p50,
                           p99_ms=p99, p999_ms=p999, p99_over_p50=p99 / p50,
                           p99_vs_ring=p99 / ring_p99, loss_pct=loss, damaged_pct=damaged,
                           samples=len(us),
                           straggler_ms=straggler)
                out.append(row)
                print(f"{env:10} {row['mib']:>4} {label:28} {p50:8.1f} {p99:8.1f} {p999:9.1f} "
                      f"{p99 / p50:8.2f} {p99 / ring_p99:10.2f}x {loss:7.3f} {damaged:9.1f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0].keys()))
            w.writeheader()
            w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
