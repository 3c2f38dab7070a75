#!/usr/bin/python3
"""The main job (./scripts/demo.sh): how long one allreduce blocks under cloud-like packet
loss and an occasional straggler, for

  Gloo ring_chunked over Gloo's TCP     (what PyTorch's Gloo backend does today)
  TAR over our UDP transport            (GLOO_ALGO=transpose GLOO_DEVICE_TRANSPORT=UDP)
  OptiReduce mode over our UDP          (GLOO_ALGO=optireduce GLOO_DEVICE_TRANSPORT=UDP)

As root it runs the cloud lab (bench/lab: one network namespace per rank on a bridge):
every row meets the same real per-packet loss (a tc eBPF drop on every rank's incoming
link) and the same seeded straggler schedule, each in a fresh lab. Not root, it runs the
local comparison (--local-ranks on loopback) with the same stragglers and no loss for any
row (Gloo's TCP cannot lose packets on loopback), and says so.

Prints one table, writes a latency CDF (PNG) and the CSVs, and says where:

  demo.py [--where lab|local] [--ranks 4] [--elements 4194304] [--iterations 200]
          [--warmup 25] [--loss 0.01] [--straggler spike:0.05:80] [--out DIR]

Columns: p50/p99 of the per-iteration time of rank 0 (timed iterations only), p99/p50,
p99 vs Gloo's (this row's p99 over the Gloo row's), injected % (the share of packets the
lab's drop lost while the row ran), deferred % (OptiReduce mode's mean share of the exact
sum that missed its operation's deadline and is carried into the next operation on the same
buffer), rel. error (||result - exact sum|| / ||exact
sum|| of one more operation after the timed ones, under the same loss and stragglers).
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "lab"))
import lab as lab_launcher  # noqa: E402  (bench/lab/lab.py: run_experiment, timed_run)

ROWS = [("Gloo ring_chunked, Gloo TCP", "allreduce_ring_chunked", "tcp"),
        ("TAR, our UDP", "transpose", "udp"),
        ("OptiReduce mode, our UDP", "optireduce", "udp")]
ENV = "demo"  # the one environment of the experiment's CSVs


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--where", choices=["lab", "local"],
                    help="lab (the default as root) or local (the default otherwise)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--elements", type=int, default=4194304,
                    help="float32 elements per buffer (default 4194304: 16 MiB)")
    ap.add_argument("--iterations", type=int, default=200, help="timed iterations per row")
    ap.add_argument("--warmup", type=int, default=25,
                    help="warm-up iterations per row, not timed (OptiReduce mode calibrates "
                         "its bound over its first 20)")
    ap.add_argument("--loss", type=float, default=0.01,
                    help="lab: per-packet drop probability on every rank's link (default "
                         "0.01); local: must be 0")
    ap.add_argument("--straggler", default="spike:0.05:80",
                    help="the last rank sleeps this delay (ms, optireduce-bench "
                         "--straggler-ms-dist spelling) before each iteration; default: "
                         "80 ms before 5%% of them; 'none' for no straggler")
    ap.add_argument("--seed", type=int, default=1, help="seed of the straggler schedule")
    ap.add_argument("--start-grace", choices=["budget", "learned"], default="learned",
                    help="OptiReduce mode's start grace (optireduce-bench --start-grace)")
    ap.add_argument("--out", default=os.path.join(REPO, "build", "demo"),
                    help="where the CSVs and the PNG go (default build/demo)")
    ap.add_argument("--bench-bin", default=lab_launcher.DEFAULT_BIN)
    ap.add_argument("--timeout", type=int, default=600, help="kill a row after this many s")
    a = ap.parse_args(argv)
    if not 2 <= a.ranks <= 16:
        ap.error("--ranks takes a number from 2 to 16, got %d" % a.ranks)
    if a.iterations < 1 or a.warmup < 0 or a.elements < 1:
        ap.error("--iterations and --elements must be positive, --warmup >= 0")
    if not 0 <= a.loss < 1:
        ap.error("--loss must be a probability in [0, 1), got %g" % a.loss)
    if a.where is None:
        a.where = "lab" if os.geteuid() == 0 else "local"
    if a.where == "lab" and os.geteuid() != 0:
        ap.error("--where lab needs root (network namespaces, veth pairs, tc)")
    if a.where == "local" and a.loss:
        a.loss = 0.0  # no row can lose packets locally: none does
    if a.straggler == "none":
        a.straggler = ""
    if not os.access(a.bench_bin, os.X_OK):
        ap.error("--bench-bin %s is not an executable (./scripts/build.sh builds it)" %
                 a.bench_bin)
    return a


def bench_flags(a):
    return ["--start-grace", a.start_grace]


def run_lab(a):
    """The rows through lab.py experiment: a fresh lab per row, same drop and stragglers."""
    argv = ["experiment", "--ranks", str(a.ranks), "--elements", str(a.elements),
            "--iterations", str(a.iterations), "--warmup", str(a.warmup),
            "--seed", str(a.seed), "--bench-bin", a.bench_bin,
            "--job-timeout", str(a.timeout), "--out", a.out,
            "--algos", ",".join("%s@%s" % (algo, t) for _, algo, t in ROWS),
            "--env", "%s:0%s" % (ENV, ":" + a.straggler if a.straggler else "")]
    if a.loss:
        argv += ["--drop", "all:%g" % a.loss]
    args = lab_launcher.build_parser().parse_args(argv)
    # OptiReduce mode's start grace, read by the harness from the library's variable (the
    # other algorithms do not read it).
    os.environ["OPTIREDUCE_START_GRACE"] = a.start_grace
    return lab_launcher.run_experiment(args, quiet=True)


def run_local(a):
    """The rows with --local-ranks on loopback, the same stragglers, no loss; the same
    CSVs as the lab's."""
    os.makedirs(a.out, exist_ok=True)
    samples_path = os.path.join(a.out, "samples.csv")
    summary_path = os.path.join(a.out, "summary.csv")
    rows = []
    with open(samples_path, "w", newline="") as fs, open(summary_path, "w", newline="") as fm:
        ws = csv.writer(fs)
        ws.writerow(["env", "bg", "algo", "elements", "iteration", "us"])
        wm = csv.DictWriter(fm, fieldnames=lab_launcher.SUMMARY_FIELDS)
        wm.writeheader()
        for label, algo, transport in ROWS:
            with tempfile.TemporaryDirectory(prefix="optireduce-demo-") as tmp:
                samples = os.path.join(tmp, "samples.csv")
                table = os.path.join(tmp, "table.csv")
                cmd = [a.bench_bin, "--local-ranks", str(a.ranks), "-t", transport,
                       "--elements", str(a.elements), "--iteration-count", str(a.iterations),
                       "--warmup-iters", str(a.warmup), "--seed", str(a.seed),
                       "--samples-csv", samples, "--csv", table, "--verify-last",
                       "--timeout", "120"] + bench_flags(a)
                if a.straggler:
                    cmd += ["--straggler-ms-dist", a.straggler]
                p = subprocess.run(cmd + [algo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, timeout=a.timeout)
                if p.returncode != 0:
                    raise RuntimeError("%s failed (rc %d):\n%s" % (" ".join(cmd + [algo]),
                                                                   p.returncode, p.stderr[-2000:]))
                r = lab_launcher.read_run(samples, table)
            v = sorted(r["us"])
            p50, p99 = lab_launcher.percentile(v, 0.5), lab_launcher.percentile(v, 0.99)
            tag = "%s@%s" % (algo, transport)
            for i, us in enumerate(r["us"]):
                ws.writerow([ENV, 0, tag, a.elements, i, "%.3f" % us])
            row = dict(env=ENV, bg=0, algo=tag, elements=a.elements, p50_us=p50, p99_us=p99,
                       p99_over_p50=p99 / p50,
                       busbw_gbps=2.0 * (a.ranks - 1) / a.ranks * a.elements * 4 / p50 / 1e3,
                       samples=len(v), transport=transport,
                       gbps=a.elements * 4 * len(v) / sum(v) / 1e3, wire_loss_pct=0.0,
                       data_loss_pct=r["loss_pct"], damaged_pct=r["damaged_pct"],
                       rel_error=r["rel_error"], straggler=a.straggler)
            wm.writerow(row)
            rows.append(row)
    return rows


def table_lines(rows):
    """The demo's table (list of lines) from the experiment's summary rows, Gloo's first."""
    head = "%-28s %8s %8s %8s %10s %10s %11s %10s" % (
        "allreduce", "p50 ms", "p99 ms", "p99/p50", "p99 vs Gloo", "injected %",
        "deferred %", "rel. error")
    lines = [head]
    gloo_p99 = rows[0]["p99_us"]
    for (label, _, _), r in zip(ROWS, rows):
        rel = r["rel_error"]
        lines.append("%-28s %8.1f %8.1f %8.2f %10.2fx %10.3f %11.3f %10s" % (
            label, r["p50_us"] / 1e3, r["p99_us"] / 1e3, r["p99_us"] / r["p50_us"],
            r["p99_us"] / gloo_p99, r["wire_loss_pct"], r["data_loss_pct"],
            "-" if rel is None else "%.2e" % rel))
    return lines


def setup_line(a):
    where = ("cloud lab: %d ranks, one network namespace each, on a bridge (MTU 9000); "
             "%g%% per-packet loss on every rank's incoming link (tc eBPF), every row" %
             (a.ranks, 100 * a.loss) if a.where == "lab" else
             "LOCAL comparison (not the lab): %d ranks on loopback, no packet loss for any "
             "row" % a.ranks)
    strag = ("the last rank sleeps %s ms (seed %d) before each iteration, the same schedule "
             "for every row" % (a.straggler, a.seed) if a.straggler else "no straggler")
    return ["%s;" % where, "%s;" % strag,
            "%.3g MiB float32 buffers, %d timed iterations per row after %d warm-up; "
            "OptiReduce start grace '%s'" % (a.elements * 4 / 2.0**20, a.iterations, a.warmup,
                                             a.start_grace)]


def plot(rows, a):
    import plots  # bench/lab/plots.py

    path = os.path.join(a.out, "cdf.png")
    with open(os.path.join(a.out, "samples.csv")) as f:
        samples = list(csv.DictReader(f))
    names = {"%s@%s" % (algo, t): label for label, algo, t in ROWS}
    for s in samples:
        s["algo"] = names.get(s["algo"], s["algo"])
        s["env"] = ("lab, %g%% loss" % (100 * a.loss) if a.where == "lab" else
                    "local, no loss") + (", straggler %s" % a.straggler if a.straggler else "")
    plots.plot_cdf(samples, path)
    return path


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.where == "local" and os.geteuid() != 0:
        print("demo: not root, so no cloud lab (it needs network namespaces, veth pairs and "
              "tc); running the LOCAL comparison instead: no packet loss for any row. "
              "Run as root for the lab.", file=sys.stderr)
    for line in setup_line(a):
        print("# " + line)
    print("# running %d rows (about %d s)..." % (len(ROWS), len(ROWS) * (a.iterations + a.warmup)
                                                 * 0.1), flush=True)
    lab_launcher.cloudlab.install_signal_handlers()
    try:
        rows = run_lab(a) if a.where == "lab" else run_local(a)
    except KeyboardInterrupt:
        print("demo: interrupted; torn down", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as e:
        print("demo: error: %s" % e, file=sys.stderr)
        return 1
    print()
    for line in table_lines(rows):
        print(line)
    png = plot(rows, a)
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write("\n".join(["# " + l for l in setup_line(a)] + table_lines(rows)) + "\n")
    print()
    print("latency CDF: %s" % png)
    print("CSV: %s (summary), %s (every timed iteration)" %
          (os.path.join(a.out, "summary.csv"), os.path.join(a.out, "samples.csv")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
