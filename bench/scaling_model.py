#!/usr/bin/python3
"""Scaling model of one allreduce: per-rank messages, bytes, incast fan-in, rounds and time
for Gloo's ring_chunked, flat TAR and 2D TAR as the rank count grows (to 1 024 and beyond),
its costs fitted from measurements at 2-16 ranks on this host.

  scaling_model.py measure --csv measured.csv [--bench-bin PATH] [--ranks 2,4,8,16]
                   [--sizes 256K,1M,4M,16M] [--algos ring,flat,2d] [--iterations N]
                   [--repeat R]
  scaling_model.py [model] [--measured measured.csv] [--bucket 25M] [--ranks-to 1024]
                   [--predict 64,256,1024] [--link-gbps 25] [--loss P] [--loss-cost-us US]
                   [--latency-us US] [--mtu 9000] [--chunk 1M]
                   [--ring A:B:K] [--flat A:B:K] [--csv table.csv] [--fit-csv fit.csv]
                   [--check-csv check.csv]

Counts per rank for a buffer of B bytes at N ranks (bench/README.md, "Scaling model"):
  ring  Gloo's allreduce_ring_chunked: 2N chunks; 4(N-1) data messages of B/2N and
        4N-5 notifications; 2(N-1)B/N bytes; fan-in 1; 2(N-1) rounds, each waiting on the
        previous one.
  flat  TAR: 2(N-1) shard messages (each of B/N, in pipeline chunks of at most --chunk)
        plus N-1 fingerprints; 2(N-1)B/N bytes; fan-in N-1; 2(N-1) rounds in two phases.
  2d    TAR in groups of G (the largest divisor of N at most sqrt N), H = N/G groups:
        TAR within the group (shards of B/G), across the groups between the ranks owning
        the same shard (pieces of B/N), back out; 2(G-1) + 2(H-1) messages (chunked the
        same way) plus (G-1) + (H-1) fingerprints; the same 2(N-1)B/N bytes; fan-in
        max(G-1, H-1); 2(G-1) + 2(H-1) rounds in four phases.

Time of one allreduce (us): t = s(m a + b b') + s^2 m k + d delta + r lambda
  m messages and b bytes per rank; s = max(1, N / cores), how many ranks share a core;
  a the cost of a message, b' of a byte, k the contention of s ranks on one core; d the
  dependent steps (ring: its 2(N-1) rounds; flat TAR: 2 phases; 2D TAR: 4) times the
  one-way network latency delta; r the expected number of steps a lost packet stalls
  (each step stalls when any of its packets, over all ranks, is lost) times lambda, the
  cost of one repair. a, b', k per algorithm are fitted by least squares on
  log(model / measured) (every coefficient non-negative) to measured p50 times, 2D TAR's
  to its own (its stages add their own per-message work); without 2D measurements it
  uses flat TAR's (the same transport and reduction code). On a cluster (--cores 0: one core per rank,
  s = 1) the byte cost is the larger of the fitted b' and the link's 8/Gbit per s.
"""

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ALGOS = ["ring", "flat", "2d"]
NAMES = {"ring": "Gloo ring_chunked", "flat": "flat TAR", "2d": "2D TAR"}
# optireduce-bench's benchmark and extra flags per model algorithm.
BENCH = {"ring": ("allreduce_ring_chunked", []), "flat": ("transpose", []),
         "2d": ("transpose", ["--layout", "2d"])}
# TAR's pipeline chunk (algorithms/allreduce.h: setPipelineChunkBytes' default).
DEFAULT_CHUNK = 1 << 20
# Constants used when no measurements are given: (a us, b' ns/B, k us).
DEFAULT_COSTS = {"ring": (27.4, 0.485, 6.36), "flat": (38.2, 0.451, 7.09)}
FEATURES = ("alpha_us", "beta_ns_per_byte", "kappa_us")


# ---- counts --------------------------------------------------------------------------
def group_size(n):
    """2D TAR's group size: the largest divisor of n that is at most sqrt(n)."""
    g = int(math.isqrt(n))
    while n % g:
        g -= 1
    return g


def pieces(nbytes, chunk):
    """Messages one transfer of nbytes takes in pipeline chunks of `chunk` (0: whole)."""
    if chunk <= 0 or nbytes <= 0:
        return 1
    return max(1, -(-int(nbytes) // chunk))


def counts(algo, n, nbytes, chunk=DEFAULT_CHUNK):
    """Per-rank counts of one allreduce of nbytes at n ranks: messages (sent), bytes (sent),
    fanin (senders into one receiver at once), rounds, steps (dependent steps on the
    critical path), group (2D TAR's G; 1 otherwise), msg_bytes (the largest data message)
    and step_packets (data messages of one dependent step, all ranks)."""
    b = float(nbytes)
    if n < 2:
        return dict(messages=0, bytes=0.0, fanin=0, rounds=0, steps=0, group=1, msg_bytes=0.0,
                    step_msgs=0.0)
    wire = 2.0 * (n - 1) / n * b
    if algo == "ring":
        return dict(messages=4 * (n - 1) + 4 * n - 5, bytes=wire, fanin=1, rounds=2 * (n - 1),
                    steps=2 * (n - 1), group=1, msg_bytes=b / (2 * n),
                    step_msgs=2.0 * n)
    if algo == "flat":
        k = pieces(b / n, chunk)
        return dict(messages=2 * (n - 1) * k + (n - 1), bytes=wire, fanin=n - 1,
                    rounds=2 * (n - 1), steps=2, group=1, msg_bytes=min(b / n, chunk or b),
                    step_msgs=float(n * (n - 1) * k))
    if algo == "2d":
        g = group_size(n)
        h = n // g
        k1, k2 = pieces(b / g, chunk), pieces(b / n, chunk)
        return dict(messages=2 * (g - 1) * k1 + 2 * (h - 1) * k2 + (g - 1) + (h - 1),
                    bytes=wire, fanin=max(g - 1, h - 1), rounds=2 * (g - 1) + 2 * (h - 1),
                    steps=4 if g > 1 else 2, group=g, msg_bytes=min(b / g, chunk or b),
                    step_msgs=float(n * max((g - 1) * k1, (h - 1) * k2)))
    raise ValueError("unknown algorithm %r (allowed: %s)" % (algo, ", ".join(ALGOS)))


def oversubscription(n, cores):
    """Ranks per core: max(1, n / cores); cores 0 means one core per rank."""
    return 1.0 if cores <= 0 else max(1.0, float(n) / cores)


def features(c, s):
    """The fitted terms' multipliers: s m, s b, s^2 m."""
    return [s * c["messages"], s * c["bytes"] * 1e-3, s * s * c["messages"]]


def expected_stalls(algo, n, nbytes, loss, mtu, chunk=DEFAULT_CHUNK):
    """Expected dependent steps that a lost packet stalls: each of the algorithm's steps
    moves step_bytes over all ranks in packets of mtu - 124 bytes of payload and stalls
    when any of them is lost."""
    c = counts(algo, n, nbytes, chunk)
    if loss <= 0 or c["steps"] == 0:
        return 0.0
    payload = max(1, mtu - 124)
    step_bytes = n * c["bytes"] / c["steps"]
    packets = step_bytes / payload + c["step_msgs"] / c["steps"]
    return c["steps"] * (1.0 - (1.0 - loss) ** packets)


def predict_us(algo, n, nbytes, costs, cores, link_gbps=0.0, latency_us=0.0, loss=0.0,
               loss_cost_us=0.0, mtu=9000, chunk=DEFAULT_CHUNK):
    """The model's time (us) of one allreduce; costs = (a us, b' ns/B, k us)."""
    c = counts(algo, n, nbytes, chunk)
    a, beta, k = costs
    if link_gbps > 0:
        beta = max(beta, 8.0 / link_gbps)  # ns per byte on the wire
    s = oversubscription(n, cores)
    t = s * (c["messages"] * a + c["bytes"] * beta * 1e-3) + s * s * c["messages"] * k
    t += c["steps"] * latency_us
    t += expected_stalls(algo, n, nbytes, loss, mtu, chunk) * loss_cost_us
    return t


# ---- fitting -------------------------------------------------------------------------
def solve(a, y):
    """Least squares for a small system (normal equations, Gaussian elimination with
    partial pivoting); returns None when singular."""
    p = len(a[0])
    ata = [[sum(r[i] * r[j] for r in a) for j in range(p)] for i in range(p)]
    aty = [sum(r[i] * v for r, v in zip(a, y)) for i in range(p)]
    m = [row[:] + [v] for row, v in zip(ata, aty)]
    for col in range(p):
        piv = max(range(col, p), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(p):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * yv for x, yv in zip(m[r], m[col])]
    return [m[i][p] / m[i][i] for i in range(p)]


def _rel_fit(rows, idx):
    """Least squares on relative error over the terms idx: a linear problem."""
    a = [[f[i] / t for i in idx] for f, t in rows]
    return solve(a, [1.0] * len(rows))


def _log_fit(rows, idx, start):
    """Least squares on log(model / measured) over the terms idx (Gauss-Newton from
    start, halving steps that do not lower the error); None when a term goes negative."""
    def err(c):
        tot = 0.0
        for f, t in rows:
            m = sum(ci * f[i] for ci, i in zip(c, idx))
            if m <= 0:
                return float("inf")
            tot += math.log(m / t) ** 2
        return tot
    c, e = list(start), err(start)
    if e == float("inf"):
        return None
    for _ in range(100):
        jac, res = [], []
        for f, t in rows:
            m = sum(ci * f[i] for ci, i in zip(c, idx))
            jac.append([f[i] / m for i in idx])
            res.append(-math.log(m / t))
        step = solve(jac, res)
        if step is None:
            break
        lam, improved = 1.0, False
        while lam > 1e-6:
            trial = [ci + lam * si for ci, si in zip(c, step)]
            if all(v >= 0 for v in trial):
                et = err(trial)
                if et < e:
                    improved = e - et > 1e-12 * max(1.0, e)
                    c, e = trial, et
                    break
            lam /= 2
        if not improved:
            break
    return c if all(v >= 0 for v in c) else None


def fit(rows, nfeat=3, log=True):
    """Fits (a, b', k) to rows of (features, time), every coefficient >= 0: the best over
    every subset of the terms. log (default): least squares on log(model / measured), so a
    point twice as slow as the model weighs as much as one twice as fast (host noise only
    ever slows a point down); otherwise on relative error. Returns (coefficients, rms of
    the relative error model / measured - 1)."""
    best = None
    for mask in range(1, 1 << nfeat):
        idx = [i for i in range(nfeat) if mask >> i & 1]
        if len(rows) < len(idx):
            continue
        sol = _rel_fit(rows, idx)
        if sol is None or any(v < 0 for v in sol):
            continue
        if log:
            sol = _log_fit(rows, idx, sol)
            if sol is None:
                continue
        coef = [0.0] * nfeat
        for i, v in zip(idx, sol):
            coef[i] = v
        model = [sum(c * x for c, x in zip(coef, f)) for f, _ in rows]
        if any(m <= 0 for m in model):
            continue
        key = sum((math.log(m / t) if log else m / t - 1) ** 2
                  for m, (_, t) in zip(model, rows))
        err = math.sqrt(sum((m / t - 1) ** 2 for m, (_, t) in zip(model, rows)) / len(rows))
        if best is None or key < best[2] - 1e-12:
            best = (coef, err, key)
    if best is None:
        raise ValueError("no non-negative fit (need at least one measurement)")
    return best[0], best[1]


def fit_measured(measured, chunk=DEFAULT_CHUNK):
    """Per algorithm measured (ring, flat, 2d): {algo: ((a, b', k), rms rel err, points)}."""
    out = {}
    for algo in ALGOS:
        rows = []
        for r in measured:
            if r["algo"] != algo:
                continue
            n, nbytes = int(r["ranks"]), int(r["bytes"])
            c = counts(algo, n, nbytes, chunk)
            rows.append((features(c, oversubscription(n, int(r["cores"]))), float(r["p50_us"])))
        if rows:
            coef, err = fit(rows)
            out[algo] = (tuple(coef), err, len(rows))
    return out


# ---- measuring -----------------------------------------------------------------------
def parse_size(text):
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        v = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError("bad size %r (e.g. 4096, 256K, 25M)" % text)
    if v <= 0:
        raise argparse.ArgumentTypeError("size must be positive, got %r" % text)
    return int(v)


def parse_list(text, conv=int):
    try:
        return [conv(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("bad list %r" % text)


def bench_help(bench_bin):
    try:
        return subprocess.run([bench_bin, "--help"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def bench_has_layout(bench_bin):
    """True when optireduce-bench takes --layout (2D TAR)."""
    return "--layout" in bench_help(bench_bin)


def layout_flags(algo, ranks, help_text):
    """optireduce-bench's flags choosing TAR's layout: flat TAR by name, 2D TAR with the
    model's group size (when it takes --group-size); none without --layout."""
    if "--layout" not in help_text or algo == "ring":
        return []
    if algo == "flat":
        return ["--layout", "flat"]
    return ["--layout", "2d"] + (["--group-size", str(group_size(ranks))]
                                 if "--group-size" in help_text else [])


def bench_cmd(bench_bin, algo, ranks, nbytes, iterations, csv_path, help_text=""):
    """optireduce-bench's command for one run (help_text: its --help, to name the layout)."""
    name = BENCH[algo][0]
    extra = layout_flags(algo, ranks, help_text)
    return [bench_bin, "--local-ranks", str(ranks), "--transport", "udp", "--elements",
            str(nbytes // 4), "--iteration-count", str(iterations), "--warmup-iters", "3",
            "--no-verify", "--csv", csv_path] + extra + [name]


def measure(a):
    """Runs optireduce-bench at every (ranks, size, algo) over our UDP on loopback and writes
    one row per run: algo, ranks, bytes, cores, p50_us, p99_us, iterations."""
    help_text = bench_help(a.bench_bin)
    algos = [x for x in a.algos if x != "2d" or "--layout" in help_text]
    skipped = [x for x in a.algos if x not in algos]
    if skipped:
        print("scaling_model: %s not measured: %s has no --layout (2D TAR not built)" %
              (", ".join(skipped), a.bench_bin), file=sys.stderr)
    cores = os.cpu_count()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        # Every (size, ranks, algorithm) once, then again: a busy spell of the host falls
        # on one run of each. The host's other work only ever slows a run down, so the
        # fastest run (lowest p50) is the one closest to the algorithm's own cost.
        for rep in range(a.repeat):
            for nbytes in a.sizes:
                for n in a.ranks:
                    for algo in algos:
                        if algo == "2d" and group_size(n) < 2:
                            continue  # no groups: 2D TAR is flat TAR
                        out = os.path.join(tmp, "%s-%d-%d-%d.csv" % (algo, n, nbytes, rep))
                        iters = a.iterations or max(5, min(30, int(64 * 2**20 / nbytes)))
                        cmd = bench_cmd(a.bench_bin, algo, n, nbytes, iters, out, help_text)
                        print("scaling_model: (run %d of %d) %s" % (
                            rep + 1, a.repeat, " ".join(shlex.quote(c) for c in cmd)), flush=True)
                        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, timeout=a.timeout)
                        if p.returncode != 0:
                            raise RuntimeError("%s failed (rc %d):\n%s" % (
                                " ".join(cmd), p.returncode, p.stderr[-2000:]))
                        with open(out) as f:
                            runs.setdefault((nbytes, n, algo), []).append(
                                list(csv.DictReader(f))[0])
    rows = []
    for (nbytes, n, algo), rs in runs.items():
        rs.sort(key=lambda r: float(r["p50_us"]))
        mid = rs[0]
        p99s = sorted(float(r["p99_us"]) for r in rs)
        rows.append(dict(algo=algo, ranks=n, bytes=nbytes, cores=cores, p50_us=mid["p50_us"],
                         p99_us="%.3f" % p99s[(len(p99s) - 1) // 2],
                         iterations=mid["iterations"], runs=len(rs)))
    write_csv(a.csv, rows)
    print("scaling_model: wrote %s (%d runs)" % (a.csv, len(rows)))
    return 0


# ---- output --------------------------------------------------------------------------
def write_csv(path, rows):
    if not path:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["algo"])
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def size_label(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            v = b / float(1 << shift)
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % b


def table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).rjust(w) for x, w in zip(r, widths))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def costs_of(a, fitted):
    costs = {}
    for algo in ("ring", "flat"):
        given = getattr(a, algo)
        if given:
            costs[algo] = given
        elif algo in fitted:
            costs[algo] = fitted[algo][0]
        else:
            costs[algo] = DEFAULT_COSTS[algo]
    costs["2d"] = fitted["2d"][0] if "2d" in fitted and not a.flat else costs["flat"]
    return costs


def parse_costs(text):
    try:
        v = tuple(float(x) for x in text.split(":"))
    except ValueError:
        v = ()
    if len(v) != 3 or any(x < 0 for x in v):
        raise argparse.ArgumentTypeError("costs are A_US:B_NS_PER_BYTE:K_US, each >= 0; got %r"
                                         % text)
    return v


def crossover(a, costs):
    """The smallest rank count (from 4 to --ranks-to, where 2D TAR has groups) at which 2D
    TAR's predicted time is below flat TAR's by at least --switch-gain for the bucket on the
    cluster, or None. A gain below that margin is within what the fit can tell apart; the
    library's switch-over (AllreduceOptions::kTwoLevelMinRanks) is this rank count rounded
    up to a power of two (from there on the gain is at least the margin)."""
    for n in range(4, a.ranks_to + 1):
        if group_size(n) < 2:
            continue
        kw = cluster_kw(a)
        if predict_us("2d", n, a.bucket, costs["2d"], **kw) * (1 + a.switch_gain) <= \
                predict_us("flat", n, a.bucket, costs["flat"], **kw):
            return n
    return None


def cluster_kw(a):
    return dict(cores=0, link_gbps=a.link_gbps, latency_us=a.latency_us, loss=a.loss,
                loss_cost_us=a.loss_cost_us, mtu=a.mtu, chunk=a.chunk)


def model(a):
    measured = read_csv(a.measured) if a.measured else []
    fitted = fit_measured(measured, a.chunk) if measured else {}
    costs = costs_of(a, fitted)
    out = []

    out.append("Costs (a: per message, b': per byte, k: contention of ranks sharing a core):")
    rows = []
    fit_rows = []
    for algo in ALGOS:
        if algo == "2d" and ("2d" not in fitted or a.flat):
            continue
        c = costs[algo]
        src = ("flag" if getattr(a, algo, None) else
               "fit of %d points, rms rel. err %.2f" % (fitted[algo][2], fitted[algo][1])
               if algo in fitted else "built-in")
        rows.append([NAMES[algo], "%.2f" % c[0], "%.4f" % c[1], "%.3f" % c[2], src])
        fit_rows.append(dict(algo=algo, alpha_us=c[0], beta_ns_per_byte=c[1], kappa_us=c[2],
                             points=fitted[algo][2] if algo in fitted else 0,
                             rms_rel_err=fitted[algo][1] if algo in fitted else ""))
    out.append(table(["algorithm", "a us", "b' ns/B", "k us", "source"], rows))
    if "2d" not in fitted or a.flat:
        out.append("2D TAR uses flat TAR's costs.")
    write_csv(a.fit_csv, fit_rows)

    if measured:
        out.append("")
        out.append("Model vs measured (this host, %s cores, our UDP on loopback; p50):" %
                   measured[0]["cores"])
        rows, check = [], []
        for r in sorted(measured, key=lambda r: (int(r["bytes"]), ALGOS.index(r["algo"]),
                                                 int(r["ranks"]))):
            n, nbytes = int(r["ranks"]), int(r["bytes"])
            t = predict_us(r["algo"], n, nbytes, costs[r["algo"]], int(r["cores"]),
                           chunk=a.chunk)
            meas = float(r["p50_us"])
            ratio = t / meas
            miss = "" if 0.7 <= ratio <= 1.4 else "outside 0.7-1.4"
            rows.append([NAMES[r["algo"]], n, size_label(nbytes), "%.2f" % (meas / 1e3),
                         "%.2f" % (t / 1e3), "%.2f" % ratio, miss])
            check.append(dict(algo=r["algo"], ranks=n, bytes=nbytes, measured_us=meas,
                              model_us=round(t, 1), ratio=round(ratio, 3),
                              fitted=r["algo"] in fitted))
        out.append(table(["algorithm", "ranks", "size", "measured ms", "model ms",
                          "model/measured", ""], rows))
        write_csv(a.check_csv, check)

    out.append("")
    kw = cluster_kw(a)
    out.append("Predictions: a %s bucket, one core per rank, %g Gbit/s links, %g us one-way "
               "latency, per-packet loss %g (a repair costs %g us), MTU %d:" % (
                   size_label(a.bucket), a.link_gbps, a.latency_us, a.loss, a.loss_cost_us,
                   a.mtu))
    ns = sorted(set([2 ** i for i in range(1, 64) if 2 ** i <= a.ranks_to] + a.predict))
    rows, csv_rows = [], []
    for n in ns:
        for algo in ALGOS:
            c = counts(algo, n, a.bucket, a.chunk)
            t = predict_us(algo, n, a.bucket, costs[algo], **kw)
            rows.append([n, NAMES[algo], c["group"] if algo == "2d" else "-", c["messages"],
                         "%.1f" % (c["bytes"] / 2**20), size_label(int(c["msg_bytes"])),
                         c["fanin"], c["rounds"], "%.2f" % (t / 1e3)])
            csv_rows.append(dict(ranks=n, algo=algo, group=c["group"], messages=c["messages"],
                                 bytes=int(c["bytes"]), msg_bytes=int(c["msg_bytes"]),
                                 fanin=c["fanin"], rounds=c["rounds"], steps=c["steps"],
                                 model_us=round(t, 1), bucket=a.bucket,
                                 link_gbps=a.link_gbps, loss=a.loss))
    out.append(table(["ranks", "algorithm", "G", "messages", "MiB sent", "largest msg",
                      "fan-in", "rounds", "model ms"], rows))
    write_csv(a.csv, csv_rows)
    x = crossover(a, costs)
    out.append("")
    if x:
        out.append("2D TAR beats flat TAR by %d%% or more from %d ranks (a %s bucket, the "
                   "inputs above): the switch-over is %d ranks." % (
                       round(100 * a.switch_gain), x, size_label(a.bucket),
                       1 << (x - 1).bit_length()))
    else:
        out.append("2D TAR is not predicted %d%% faster than flat TAR at any rank count up to "
                   "%d (a %s bucket, the inputs above)." % (
                       round(100 * a.switch_gain), a.ranks_to, size_label(a.bucket)))
    print("\n".join(out))
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    m = sub.add_parser("measure", help="measure ring and flat (and 2D) TAR at 2-16 ranks")
    m.add_argument("--csv", required=True, help="where the measurements go")
    build = os.environ.get("OPTIREDUCE_BUILD_DIR", os.path.join(REPO, "build"))
    m.add_argument("--bench-bin", default=os.path.join(build, "bench", "optireduce-bench"))
    m.add_argument("--ranks", type=parse_list, default=[2, 4, 8, 16])
    m.add_argument("--sizes", type=lambda t: parse_list(t, parse_size),
                   default=[256 << 10, 1 << 20, 4 << 20, 16 << 20])
    m.add_argument("--algos", type=lambda t: parse_list(t, str), default=list(ALGOS))
    m.add_argument("--iterations", type=int, default=0,
                   help="timed iterations per run (default: 5-30 by size)")
    m.add_argument("--repeat", type=int, default=1,
                   help="runs of each point, interleaved; the run with the lowest p50 is kept")
    m.add_argument("--timeout", type=float, default=600)
    for p in (ap, sub.add_parser("model", help="fit and predict (the default)")):
        p.add_argument("--measured", help="measure's CSV: fit the costs to it")
        p.add_argument("--bucket", type=parse_size, default=25 << 20)
        p.add_argument("--ranks-to", type=int, default=1024)
        p.add_argument("--switch-gain", type=float, default=0.10,
                       help="the least predicted gain of 2D TAR over flat TAR that picks "
                            "the switch-over (default 0.10)")
        p.add_argument("--predict", type=parse_list, default=[64, 256, 1024])
        p.add_argument("--link-gbps", type=float, default=25.0)
        p.add_argument("--latency-us", type=float, default=10.0)
        p.add_argument("--loss", type=float, default=0.0)
        p.add_argument("--loss-cost-us", type=float, default=200.0)
        p.add_argument("--mtu", type=int, default=9000)
        p.add_argument("--chunk", type=parse_size, default=DEFAULT_CHUNK)
        p.add_argument("--ring", type=parse_costs, help="ring's costs A_US:B_NS:K_US")
        p.add_argument("--flat", type=parse_costs, help="flat TAR's costs A_US:B_NS:K_US")
        p.add_argument("--csv", help="write the predictions")
        p.add_argument("--fit-csv", help="write the costs")
        p.add_argument("--check-csv", help="write model vs measured")
    a = ap.parse_args(argv)
    if a.cmd == "measure":
        bad = [x for x in a.algos if x not in ALGOS]
        if bad:
            ap.error("--algos: unknown algorithm '%s' (allowed: %s)" % (bad[0], ", ".join(ALGOS)))
        if not os.access(a.bench_bin, os.X_OK):
            ap.error("%s is not an executable (./scripts/build.sh builds it)" % a.bench_bin)
        if a.repeat < 1:
            ap.error("--repeat must be at least 1")
        if any(n < 2 for n in a.ranks):
            ap.error("--ranks: every rank count must be at least 2")
    else:
        if not 0 <= a.loss < 1:
            ap.error("--loss must be in [0, 1), got %g" % a.loss)
        if a.ranks_to < 2:
            ap.error("--ranks-to must be at least 2")
        if a.mtu < 256:
            ap.error("--mtu must be at least 256")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    return measure(a) if a.cmd == "measure" else model(a)


if __name__ == "__main__":
    sys.exit(main())
