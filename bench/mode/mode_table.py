#!/usr/bin/python3
"""OptiReduce mode's benchmark: p50/p99/p99.9 of Gloo ring_chunked over Gloo's TCP,
reliable TAR and OptiReduce mode (both over our UDP transport), 4 ranks, three environments,
one run:

  none      no faults
  loss      1% packet loss. In the lab (--where lab, the default as root): real loss, a tc
            eBPF drop on every rank's incoming link, for every algorithm — Gloo's TCP meets
            it too. Locally (--where local): seeded datagram loss in our transport's I/O
            layer; Gloo's TCP cannot lose packets on loopback, so ring's row there runs over
            our UDP transport, which retransmits them
  straggler one rank (the last) sleeps a random delay before each iteration (--straggler);
            the default auto-spike:0.05:2 is an occasional straggler: with probability 0.05
            a delay of 2 x Gloo ring's no-fault p50 at that size, which puts ring's p99 at
            about 3 x its p50. auto-exp:F (auto:F) delays every iteration by an exponential
            of mean F x ring's p50 instead (F = 0.8 also gives ring p99/p50 about 3:
            (b + 4.6 m) / (b + 0.69 m)) — a rank slow every time, which no bounded wait can
            absorb: it only falls behind and is met one operation later

  /usr/bin/python3 bench/mode/mode_table.py [--where lab|local] [--sizes 4194304,16777216]
      [--iters 100] [--straggler auto-spike:0.05:2 | auto-exp:0.8 | spike:0.05:80 | exp:15]
      [--repair-budgets 1,0.25,0] [--start-graces budget,learned] [--csv FILE]

Every run is optireduce-bench with --samples-csv (4 lab namespaces on a bridge with MTU 9000
links, or --local-ranks 4 on loopback); percentiles are over the timed iterations of rank 0
(p99.9 needs >= 1000 iterations to differ from the max).
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "lab"))
import cloudlab  # noqa: E402
import lab as lab_launcher  # noqa: E402  (bench/lab/lab.py: run_ranks)

RANKS = 4
LOSS = 0.01

ALGOS = [("ring_chunked", "allreduce_ring_chunked"), ("TAR", "transpose"),
         ("OptiReduce", "optireduce")]


def percentile(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    k = min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))
    return v[k]


def run_local(bench, flags, env_extra, timeout, samples):
    cmd = [bench, "--local-ranks", str(RANKS)] + flags
    env = dict(os.environ, **env_extra)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")


def run_lab(bench, flags, env_extra, timeout, loss, pin=False):
    """One rank per namespace of a fresh lab; `loss` drops on every rank's incoming link;
    `pin`: each rank's process on one CPU (cloudlab.Lab pin_cpus)."""
    with cloudlab.Lab(RANKS, pin_cpus=pin) as lab:
        if loss:
            for r in range(RANKS):
                lab.set_drop(r, loss, "in")
        shared = os.path.join(lab.tmp, "rdv")
        os.makedirs(shared)
        cmds = [[bench, "--size", str(RANKS), "--rank", str(r), "--shared-path", shared,
                 "--prefix", "mode", "--tcp-device", "eth0"] + flags for r in range(RANKS)]
        rc, _, errs = lab_launcher.run_ranks(lab, cmds, timeout, env=dict(os.environ, **env_extra))
        if rc != 0:
            why = "timed out after %d s" % timeout if rc == 124 else "exited %d" % rc
            tails = "\n".join("--- rank %d ---\n%s" % (r, e.strip()[-2000:])
                              for r, e in sorted(errs.items()))
            raise RuntimeError("%s in the lab %s:\n%s" % (" ".join(flags), why, tails))


def run(bench, algo, transport, elements, iters, env_extra, straggler, timeout,
        repair_budget=None, where="local", loss=0.0, start_grace=None, pin=False):
    with tempfile.TemporaryDirectory() as tmp:
        samples = os.path.join(tmp, "s.csv")
        flags = ["-t", transport, "--elements", str(elements),
                 "--iteration-count", str(iters), "--warmup-iters", "25",
                 "--samples-csv", samples, "--timeout", "120"]
        if repair_budget is not None:
            flags += ["--repair-budget", repair_budget]
        if start_grace is not None:
            flags += ["--start-grace", start_grace]
        if straggler:
            flags += ["--straggler-ms-dist", straggler]
        flags.append(algo)
        if where == "lab":
            run_lab(bench, flags, env_extra, timeout, loss, pin)
        else:
            run_local(bench, flags, env_extra, timeout, samples)
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
    ap.add_argument("--where", choices=["lab", "local"],
                    default="lab" if os.geteuid() == 0 else "local",
                    help="lab: one rank per network namespace, real packet loss (root; the "
                         "default as root); local: --local-ranks on loopback")
    ap.add_argument("--straggler", default="auto-spike:0.05:2",
                    help="delay distribution (ms) of the straggler env (optireduce-bench "
                         "spelling), auto-spike:P:F (probability P of F x ring's no-fault p50 "
                         "at each size) or auto-exp:F (= auto:F; exponential of mean F x p50)")
    ap.add_argument("--envs", default="none,loss,straggler")
    ap.add_argument("--repair-budgets", default="1",
                    help="OptiReduce rows, one per repair budget (fraction of the bound; "
                         "0 = never repair), comma-separated, e.g. 1,0.25,0")
    ap.add_argument("--start-graces", default="budget",
                    help="OptiReduce rows, one per start grace (budget: a rank that has not "
                         "started keeps the repair budget; learned: P90 x 1.25 of how late "
                         "ranks started), comma-separated, e.g. budget,learned")
    ap.add_argument("--pin", action="store_true",
                    help="lab only: every process of rank r on one CPU (r mod the CPUs), as "
                         "if each rank had a host's CPU of its own (bench/lab --pin)")
    ap.add_argument("--csv", default="")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "optireduce-bench"))
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        ap.error(f"--sizes: expected comma-separated integers, got '{args.sizes}'")
    if args.pin and args.where != "lab":
        ap.error("--pin: only with --where lab (ranks in namespaces, one process each)")
    envs = [e for e in args.envs.split(",") if e]
    for e in envs:
        if e not in ("none", "loss", "straggler"):
            ap.error(f"--envs: unknown environment '{e}' (allowed: none, loss, straggler)")
    auto_scale, auto_prob = None, None  # auto stragglers: scale of ring's p50, spike probability
    if args.straggler.startswith(("auto:", "auto-exp:", "auto-spike:")):
        parts = args.straggler.split(":")[1:]
        try:
            nums = [float(x) for x in parts]
        except ValueError:
            nums = []
        if args.straggler.startswith("auto-spike:"):
            if len(nums) != 2 or not 0 < nums[0] <= 1 or not nums[1] > 0:
                ap.error(f"--straggler: auto-spike:P:F needs 0 < P <= 1 and F > 0, "
                         f"got '{args.straggler}'")
            auto_prob, auto_scale = nums
        else:
            if len(nums) != 1 or not nums[0] > 0:
                ap.error(f"--straggler: auto-exp:F needs a positive number F, "
                         f"got '{args.straggler}'")
            auto_scale = nums[0]
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
    graces = [g for g in args.start_graces.split(",") if g]
    for g in graces:
        if g not in ("budget", "learned"):
            ap.error(f"--start-graces: '{g}' is not budget or learned")
    if not graces:
        ap.error("--start-graces: give at least one, e.g. budget")
    algos = [(name, algo, None, None) for name, algo in ALGOS if algo != "optireduce"]
    algos += [("OptiReduce", "optireduce", b, g) for b in budgets for g in graces]
    if not os.access(args.bench, os.X_OK):
        ap.error(f"--bench: '{args.bench}' is not an executable (build it: ./scripts/build.sh)")

    out = []
    ring_p50_none = {}  # elements -> Gloo ring's p50 (ms) without faults, for auto stragglers
    print(f"{'env':10} {'MiB':>4} {'algorithm':36} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
          f"{'p99/p50':>8} {'p99 vs ring':>11} {'loss %':>7} {'damaged %':>9}", flush=True)
    for env in envs:
        for elements in sizes:
            ring_p99 = None
            for name, algo, budget, grace in algos:
                transport = "tcp" if algo == "allreduce_ring_chunked" else "udp"
                extra = {}
                straggler = args.straggler if env == "straggler" else ""
                if env == "straggler" and auto_scale is not None:
                    if elements not in ring_p50_none:
                        us, _, _ = run(args.bench, "allreduce_ring_chunked", "tcp", elements,
                                       args.iters, {}, "", timeout=1800, where=args.where,
                                       pin=args.pin)
                        ring_p50_none[elements] = percentile(us, 0.5) / 1e3
                    ms = auto_scale * ring_p50_none[elements]
                    straggler = f"spike:{auto_prob}:{ms:.1f}" if auto_prob else f"exp:{ms:.1f}"
                    if name == algos[0][0]:
                        print(f"# straggler at {elements * 4 // (1 << 20)} MiB: {straggler} ms "
                              f"({auto_scale} x ring's no-fault p50)", flush=True)
                link_loss = LOSS if env == "loss" and args.where == "lab" else 0.0
                if env == "loss" and args.where == "local":
                    extra["OPTIREDUCE_FAULTS"] = f"drop={LOSS},seed=7"
                    transport = "udp"
                detail = [transport]
                if budget is not None and budgets != ["1"]:
                    detail.append(f"repair {budget}")
                if grace is not None and graces != ["budget"]:
                    detail.append(f"grace {grace}")
                label = f"{name} ({', '.join(detail)})"
                us, loss, damaged = run(args.bench, algo, transport, elements, args.iters, extra,
                                        straggler, timeout=1800, repair_budget=budget,
                                        where=args.where, loss=link_loss, start_grace=grace,
                                        pin=args.pin)
                p50, p99, p999 = (percentile(us, q) / 1e3 for q in (0.5, 0.99, 0.999))
                if ring_p99 is None:
                    ring_p99 = p99
                if env == "none" and algo == "allreduce_ring_chunked":
                    ring_p50_none[elements] = p50
                row = dict(where=args.where + ("+pin" if args.pin else ""), env=env,
                           mib=elements * 4 // (1 << 20), algorithm=label, p50_ms=p50,
                           p99_ms=p99, p999_ms=p999, p99_over_p50=p99 / p50,
                           p99_vs_ring=p99 / ring_p99, loss_pct=loss, damaged_pct=damaged,
                           samples=len(us),
                           straggler_ms=straggler)
                out.append(row)
                print(f"{env:10} {row['mib']:>4} {label:36} {p50:8.1f} {p99:8.1f} {p999:9.1f} "
                      f"{p99 / p50:8.2f} {p99 / ring_p99:10.2f}x {loss:7.3f} {damaged:9.1f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0].keys()))
            w.writeheader()
            w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
