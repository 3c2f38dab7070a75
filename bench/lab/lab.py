#!/usr/bin/python3
"""Cloud lab launcher: runs optireduce-bench (or any command) on N ranks, each in its own
network namespace, with injected loss, rate limits, background allreduce jobs and
stragglers. Always tears everything down (also on failure and Ctrl-C).

  lab.py bench --ranks 4 --bg 2 --drop all:0.01 allreduce_ring --elements 1000000
  lab.py bench --drop all:0.01 --drop-pattern burst:8 allreduce_ring --elements 1000000
  lab.py run --ranks 2 -- /bin/sh -c 'echo rank {rank} of {size} at {ip}'
  lab.py calibrate --ranks 4 --bg-list 0,1,2,4,8 --csv calib.csv
  lab.py experiment --ranks 4 --env ideal:0 --env p15:2 --env p3:6 --out results/
  lab.py cleanup              # (or --cleanup) remove leftovers of killed labs by name

See bench/README.md for what each experiment measures.
"""

import argparse
import copy
import csv
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cloudlab  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_BIN = os.path.join(REPO, "build", "bench", "optireduce-bench")


def parse_rank_spec(spec, ranks, what):
    """'all:V' or 'R[,R...]:V' -> ([ranks], 'V')."""
    if ":" not in spec:
        raise SystemExit("error: %s '%s': expected RANKS:VALUE, e.g. all:%s" %
                         (what, spec, "0.01" if what == "--drop" else "1gbit"))
    who, value = spec.split(":", 1)
    if who == "all":
        return list(range(ranks)), value
    try:
        rs = [int(x) for x in who.split(",")]
    except ValueError:
        raise SystemExit("error: %s '%s': ranks must be 'all' or numbers like 0,2" % (what, spec))
    for r in rs:
        if not 0 <= r < ranks:
            raise SystemExit("error: %s '%s': rank %d is not in 0..%d" % (what, spec, r, ranks - 1))
    return rs, value


def make_lab(args):
    return cloudlab.Lab(args.ranks, mtu=args.mtu, wire_segments=not args.gso_bursts,
                        pin_cpus=args.pin)


def drop_pattern(args):
    """--drop-pattern -> cloudlab.DropPattern (SystemExit naming the problem)."""
    try:
        return cloudlab.DropPattern.parse(args.drop_pattern)
    except ValueError as e:
        raise SystemExit("error: --drop-pattern: %s" % e)


def drop_specs(args, ranks):
    """Every --drop as (ranks, probability), checked against --drop-pattern (SystemExit
    naming the problem)."""
    pattern = drop_pattern(args)
    if pattern.kind != "random" and not args.drop:
        raise SystemExit("error: --drop-pattern %s needs --drop RANKS:P (the loss it "
                         "distributes)" % args.drop_pattern)
    specs = []
    for spec in args.drop or []:
        rs, v = parse_rank_spec(spec, ranks, "--drop")
        try:
            p = float(v)
        except ValueError:
            raise SystemExit("error: --drop '%s': probability must be a number in [0, 1]" % spec)
        try:
            pattern.check(p)
        except ValueError as e:
            raise SystemExit("error: --drop '%s' with --drop-pattern %s: %s" %
                             (spec, args.drop_pattern, e))
        specs.append((rs, p))
    return specs


def apply_knobs(lab, args):
    pattern = drop_pattern(args)
    for rs, p in drop_specs(args, lab.ranks):
        for r in rs:
            lab.set_drop(r, p, args.drop_direction, pattern)
    for spec in args.rate or []:
        rs, v = parse_rank_spec(spec, lab.ranks, "--rate")
        for r in rs:
            lab.set_rate(r, v)


TRANSPORTS = ("tcp", "udp", "dpdk")  # optireduce-bench --transport

# --transport dpdk: each rank's DPDK device takes its namespace's eth0 through af_packet (no
# NIC, no hugepages), with the large receive ring af_packet needs; OPTIREDUCE_EAL_ARGS in
# our environment overrides it.
DPDK_EAL_ARGS = ("--no-huge --no-shconf -m 512 --no-pci --no-telemetry --log-level=*:warning "
                 "--vdev=net_af_packet0,iface=eth0,framecnt=16384,blocksz=4096,framesz=2048")


def rank_env(args):
    """The environment of every rank's optireduce-bench: ours, plus the dpdk ports."""
    env = dict(os.environ)
    if args.transport == "dpdk":
        env.setdefault("OPTIREDUCE_EAL_ARGS", DPDK_EAL_ARGS)
    return env


def bench_cmd(args, lab, rank, algo, extra, shared, prefix):
    return [args.bench_bin, "--size", str(lab.ranks), "--rank", str(rank),
            "--shared-path", shared, "--prefix", prefix, "--tcp-device", "eth0",
            "--transport", args.transport, "--timeout", str(args.timeout)] + extra + [algo]


def start_background(lab, args):
    """K background allreduce jobs over all ranks, sharing the links with the measured job."""
    procs = []
    for j in range(args.bg):
        shared = os.path.join(lab.tmp, "bg%d" % j)
        os.makedirs(shared, exist_ok=True)
        for r in range(lab.ranks):
            cmd = bench_cmd(args, lab, r, args.bg_algo,
                            ["--no-verify", "--warmup-iters", "0", "--iteration-count",
                             "1000000000", "--elements", str(args.bg_elements)] +
                            (["--straggler-ms-dist", args.bg_gap_ms_dist, "--seed", str(j + 7)]
                             if args.bg_gap_ms_dist else []),
                            shared, "bg%d" % j)
            procs.append(lab.spawn(r, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env=rank_env(args)))
    if procs:
        time.sleep(args.bg_settle)
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError("%d background processes exited early (rc %s)" %
                               (len(dead), dead[0].returncode))
    return procs


def run_ranks(lab, cmds, timeout, env=None):
    """Runs one command per rank (environment `env`, default ours); returns (rc, rank 0
    stdout, {rank: stderr}). A rank that fails ends the others; the whole job is killed after
    `timeout` seconds (rc 124)."""
    outs, procs = [], []
    for r, cmd in enumerate(cmds):
        out = open(os.path.join(lab.tmp, "rank%d.out" % r), "w+")
        err = open(os.path.join(lab.tmp, "rank%d.err" % r), "w+")
        outs.append((out, err))
        procs.append(lab.spawn(r, cmd, stdout=out, stderr=err, env=env))
    deadline = time.time() + timeout
    rc = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                rc = failed[0].returncode
                break
            if time.time() > deadline:
                rc = 124
                print("lab: job still running after %d s: killing it" % timeout, file=sys.stderr)
                break
            time.sleep(0.05)
        if rc == 0:
            rc = next((p.returncode for p in procs if p.returncode != 0), 0)
    finally:
        lab.kill(procs)
    texts = []
    for out, err in outs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    return rc, texts[0][0], {r: t[1] for r, t in enumerate(texts) if t[1].strip()}


def measured_bench(lab, args, algo, extra, tag):
    shared = os.path.join(lab.tmp, "fg-%s" % tag)
    os.makedirs(shared, exist_ok=True)
    cmds = [bench_cmd(args, lab, r, algo, extra, shared, "fg") for r in range(lab.ranks)]
    return run_ranks(lab, cmds, args.job_timeout, env=rank_env(args))


def report_failure(rc, errs):
    print("lab: job failed (rc %d)" % rc, file=sys.stderr)
    for r, e in sorted(errs.items()):
        print("--- rank %d stderr ---\n%s" % (r, e.strip()[-2000:]), file=sys.stderr)


# ---- subcommands --------------------------------------------------------------------
def cmd_run(args):
    if not args.command:
        raise SystemExit("error: run: give the command after --")
    with make_lab(args) as lab:
        apply_knobs(lab, args)
        start_background(lab, args)
        cmds = []
        for r in range(lab.ranks):
            fill = dict(rank=r, size=lab.ranks, ip=lab.ips[r], ns=lab.ns[r], shared=lab.tmp,
                        iface="eth0")
            cmds.append([c.format(**fill) for c in args.command])
        rc, out, errs = run_ranks(lab, cmds, args.job_timeout)
        sys.stdout.write(out)
        if rc != 0:
            report_failure(rc, errs)
        return rc


def cmd_bench(args):
    extra = list(args.harness_args)
    if args.straggler_ms_dist:
        extra += ["--straggler-ms-dist", args.straggler_ms_dist]
    with make_lab(args) as lab:
        apply_knobs(lab, args)
        start_background(lab, args)
        rc, out, errs = measured_bench(lab, args, args.algo, extra, "main")
        sys.stdout.write(out)
        if rc != 0:
            report_failure(rc, errs)
        return rc


def percentile(sorted_v, p):
    return sorted_v[min(len(sorted_v) - 1, int(p * len(sorted_v)))]


def read_samples(path):
    with open(path) as f:
        return [float(row["us"]) for row in csv.DictReader(f)]


def timed_run(lab, args, algo, tag, extra_more=()):
    """Runs algo once at --elements with --iterations (after --warmup warm-up iterations,
    which are not timed); returns a dict: us (per timed iteration of rank 0), loss_pct
    (OptiReduce mode's mean share of data not received), damaged_pct (share of operations
    it flagged), rel_error (of one more operation after the timed ones: the harness's
    --verify-last)."""
    path = os.path.join(lab.tmp, "samples-%s.csv" % tag)
    table = os.path.join(lab.tmp, "table-%s.csv" % tag)
    counters = os.path.join(lab.tmp, "counters-%s.csv" % tag)
    extra = ["--elements", str(args.elements), "--iteration-count", str(args.iterations),
             "--warmup-iters", str(getattr(args, "warmup", 5)), "--samples-csv", path,
             "--csv", table, "--verify-last", "--counters-csv", counters,
             "--seed", str(getattr(args, "seed", 1))] + list(extra_more)
    if getattr(args, "straggler_ms_dist", None):
        extra += ["--straggler-ms-dist", args.straggler_ms_dist]
    rc, out, errs = measured_bench(lab, args, algo, extra, tag)
    if rc != 0:
        report_failure(rc, errs)
        raise RuntimeError("%s failed in environment %s" % (algo, tag))
    return dict(read_run(path, table), **read_counters(counters, lab.ranks))


def read_counters(prefix, ranks):
    """The ranks' --counters-csv files (PREFIX.R) -> sent_pkts, resent_pkts and
    spurious_pkts (resends the receivers reported duplicate: ours, the engine's
    spurious_retransmits; Gloo TCP, the kernel's DSACKed segments) summed over the ranks
    (None where a rank wrote none)."""
    fields = dict(sent_pkts="sent_packets", resent_pkts="resent_packets",
                  spurious_pkts="spurious")
    sums = dict.fromkeys(fields, 0)
    for r in range(ranks):
        try:
            with open("%s.%d" % (prefix, r)) as f:
                rows = list(csv.DictReader(f))
        except OSError:
            return dict.fromkeys(fields)
        if not rows or rows[0]["source"] == "none":
            return dict.fromkeys(fields)
        for k, column in fields.items():
            sums[k] += int(rows[0][column])
    return sums


def read_run(samples_csv, table_csv):
    """One optireduce-bench run's --samples-csv and --csv files -> timed_run's dict."""
    with open(samples_csv) as f:
        rows = list(csv.DictReader(f))
    with open(table_csv) as f:
        summary = list(csv.DictReader(f))
    rel = summary[0].get("rel_error_last") or summary[0]["rel_error"] if summary else ""
    n = max(1, len(rows))
    return dict(us=[float(r["us"]) for r in rows],
                loss_pct=sum(float(r["loss_pct"]) for r in rows) / n,
                damaged_pct=100.0 * sum(int(r["damaged"]) for r in rows) / n,
                rel_error=float(rel) if rel else None)


def timed_samples(lab, args, algo, tag, extra_more=()):
    """Runs algo once at --elements with --iterations; returns the per-iteration us."""
    return timed_run(lab, args, algo, tag, extra_more)["us"]


def cmd_calibrate(args):
    """p99/p50 of the measured algorithm for each number of background jobs."""
    ks = [int(k) for k in args.bg_list.split(",")]
    rows = []
    print("%4s %10s %10s %9s %8s" % ("K", "p50 (us)", "p99 (us)", "p99/p50", "samples"))
    for k in ks:
        args.bg = k
        with make_lab(args) as lab:
            apply_knobs(lab, args)
            start_background(lab, args)
            v = sorted(timed_samples(lab, args, args.algo, "k%d" % k))
        p50, p99 = percentile(v, 0.5), percentile(v, 0.99)
        rows.append(dict(k=k, algo=args.algo, elements=args.elements, p50_us=p50, p99_us=p99,
                         ratio=p99 / p50, samples=len(v)))
        print("%4d %10.0f %10.0f %9.2f %8d" % (k, p50, p99, p99 / p50, len(v)), flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    return 0


def parse_algo_at_transport(spec, default_transport):
    """'ALGO' or 'ALGO@TRANSPORT' (one --algos entry) -> (algo, transport, label); the label
    names the transport only where the entry did."""
    algo, at, transport = spec.partition("@")
    if not algo:
        raise SystemExit("error: --algos: '%s' has no algorithm name" % spec)
    if at and transport not in TRANSPORTS:
        raise SystemExit("error: --algos: '%s': transport '%s' is not one of %s" %
                         (spec, transport, ", ".join(TRANSPORTS)))
    return algo, transport if at else default_transport, spec


def parse_envs(args):
    envs = []
    for e in args.env:
        name, _, rest = e.partition(":")
        k, _, straggler = rest.partition(":")
        try:
            envs.append((name, int(k), straggler or args.straggler_ms_dist))
        except ValueError:
            raise SystemExit("error: --env '%s': expected NAME:K[:STRAGGLER_DIST], e.g. p15:2 "
                             "or slow:0:exp:30" % e)
    return envs


SUMMARY_FIELDS = ["env", "bg", "algo", "elements", "p50_us", "p99_us", "p99_over_p50",
                  "busbw_gbps", "samples", "transport", "gbps", "wire_loss_pct",
                  "data_loss_pct", "damaged_pct", "rel_error", "straggler", "dropped_pkts",
                  "resent_pkts", "resent_per_dropped", "spurious_pkts"]


def run_experiment(args, quiet=False):
    """Every algorithm of --algos in every --env, each in a fresh lab with the same --drop,
    --rate, straggler distribution and --seed; writes samples.csv (every timed iteration)
    and summary.csv to --out and returns the summary rows (dicts of SUMMARY_FIELDS, numbers
    as numbers). wire_loss_pct is the share of packets the eBPF drop lost during the job
    (measured on the links, so every row's injected loss can be compared); dropped_pkts
    those packets, resent_pkts what the ranks' transports resent over the run (ours: the
    engine's retransmissions and probes; Gloo TCP: the kernel's RetransSegs of the ranks'
    namespaces) and resent_per_dropped their ratio (a lost ack needs no resend, a
    needless resend counts); spurious_pkts the resends the receivers reported duplicate,
    needless ones (ours: the engine's spurious_retransmits; Gloo TCP: the segments the
    kernel saw DSACKed, TCPDSACKRecvSegs)."""
    envs = parse_envs(args)
    algos = [parse_algo_at_transport(a, args.transport) for a in args.algos.split(",")]
    os.makedirs(args.out, exist_ok=True)
    samples_path = os.path.join(args.out, "samples.csv")
    summary_path = os.path.join(args.out, "summary.csv")
    rows = []
    with open(samples_path, "w", newline="") as fs, open(summary_path, "w", newline="") as fm:
        ws = csv.writer(fs)
        ws.writerow(["env", "bg", "algo", "elements", "iteration", "us"])
        wm = csv.DictWriter(fm, fieldnames=SUMMARY_FIELDS)
        wm.writeheader()
        if not quiet:
            print("%-8s %3s %-28s %10s %10s %8s %10s %8s %7s" %
                  ("env", "K", "algorithm", "p50 (us)", "p99 (us)", "p99/p50", "busbw GB/s",
                   "GB/s", "wire %"))
        for env, k, straggler in envs:
            for algo, transport, label in algos:
                args.bg = k
                args.straggler_ms_dist = straggler
                measured = copy.copy(args)  # background jobs keep the lab's --transport
                measured.transport = transport
                # Each algorithm in a fresh lab and processes (see bench/README.md).
                with make_lab(args) as lab:
                    apply_knobs(lab, args)
                    start_background(lab, args)
                    r = timed_run(lab, measured, algo, "%s-%s-%s" % (env, algo, transport))
                    packets, dropped = lab.drop_counts()
                v = r["us"]
                for i, us in enumerate(v):
                    ws.writerow([env, k, label, args.elements, i, "%.3f" % us])
                s = sorted(v)
                p50, p99 = percentile(s, 0.5), percentile(s, 0.99)
                n = args.ranks
                busbw = 2.0 * (n - 1) / n * args.elements * 4 / (p50 * 1e-6) / 1e9
                # Gloo's harness's bandwidth: bytes of one buffer x iterations / total time.
                gbps = args.elements * 4 * len(v) / (sum(v) * 1e-6) / 1e9
                row = dict(env=env, bg=k, algo=label, elements=args.elements, p50_us=p50,
                           p99_us=p99, p99_over_p50=p99 / p50, busbw_gbps=busbw,
                           samples=len(v), transport=transport, gbps=gbps,
                           wire_loss_pct=100.0 * dropped / packets if packets else 0.0,
                           data_loss_pct=r["loss_pct"], damaged_pct=r["damaged_pct"],
                           rel_error=r["rel_error"], straggler=straggler or "",
                           dropped_pkts=dropped, resent_pkts=r["resent_pkts"],
                           resent_per_dropped=(r["resent_pkts"] / dropped
                                               if dropped and r["resent_pkts"] is not None
                                               else None),
                           spurious_pkts=r["spurious_pkts"])
                rows.append(row)
                wm.writerow(dict(row, p50_us="%.1f" % p50, p99_us="%.1f" % p99,
                                 p99_over_p50="%.3f" % (p99 / p50), busbw_gbps="%.4f" % busbw,
                                 gbps="%.4f" % gbps,
                                 wire_loss_pct="%.3f" % row["wire_loss_pct"],
                                 data_loss_pct="%.3f" % r["loss_pct"],
                                 damaged_pct="%.1f" % r["damaged_pct"],
                                 rel_error="" if r["rel_error"] is None else
                                 "%.3g" % r["rel_error"],
                                 resent_pkts="" if r["resent_pkts"] is None else r["resent_pkts"],
                                 spurious_pkts="" if r["spurious_pkts"] is None
                                 else r["spurious_pkts"],
                                 resent_per_dropped="" if row["resent_per_dropped"] is None
                                 else "%.3f" % row["resent_per_dropped"]))
                fm.flush()
                if not quiet:
                    print("%-8s %3d %-28s %10.0f %10.0f %8.2f %10.3f %8.3f %7.3f" %
                          (env, k, label, p50, p99, p99 / p50, busbw, gbps,
                           row["wire_loss_pct"]), flush=True)
    return rows


def cmd_experiment(args):
    """Every algorithm in every environment (NAME:K background jobs); writes samples.csv
    (all iterations) and summary.csv to --out, then the plots."""
    run_experiment(args)
    import plots
    plots.plot_all(os.path.join(args.out, "samples.csv"), os.path.join(args.out, "summary.csv"),
                   args.out)
    return 0


def cmd_cleanup(args):
    removed = cloudlab.cleanup_leftovers(args.owner)
    print("removed %d: %s" % (len(removed), " ".join(removed)) if removed else "nothing to remove")
    return 0


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--ranks", type=int, default=4, help="ranks (namespaces), default 4")
        p.add_argument("--drop", action="append", metavar="RANKS:P",
                       help="loss, e.g. all:0.01 or 1,2:0.05 (tc eBPF; see --drop-pattern); "
                            "repeatable")
        p.add_argument("--drop-pattern", default="random", metavar="PATTERN",
                       help="how --drop's loss falls on the packets: random (default: each "
                            "packet independently), burst:B (Gilbert-Elliott: the same "
                            "average loss in runs of B packets on average), acks[:MAXLEN] "
                            "(only packets of at most MAXLEN bytes of IPv4 total length, "
                            "default %d: pure TCP ACKs and our acks, never MTU-sized data)"
                            % cloudlab.DEFAULT_ACK_MAX_LEN)
        p.add_argument("--drop-direction", choices=["in", "out", "both"], default="in",
                       help="in (default): packets entering the rank, one at a time (the "
                            "bridge segments bursts first), so every packet crosses one drop; "
                            "out/both also drop what the rank sends, as whole 64 KiB "
                            "segmentation bursts")
        p.add_argument("--rate", action="append", metavar="RANKS:RATE",
                       help="tbf rate limit, e.g. all:2gbit; repeatable")
        p.add_argument("--bg", type=int, default=0, help="background allreduce jobs (K)")
        p.add_argument("--bg-algo", default="allreduce_ring")
        p.add_argument("--bg-elements", type=int, default=1000000)
        p.add_argument("--bg-gap-ms-dist", metavar="DIST",
                       help="idle gap before each background allreduce, e.g. exp:20 "
                            "(bursty traffic; same syntax as --straggler-ms-dist)")
        p.add_argument("--bg-settle", type=float, default=1.0,
                       help="seconds to let background jobs start before measuring")
        p.add_argument("--bench-bin", default=DEFAULT_BIN)
        p.add_argument("--transport", default="tcp", choices=TRANSPORTS)
        p.add_argument("--mtu", type=int, default=cloudlab.DEFAULT_MTU,
                       help="MTU of every link (default %d: cloud jumbo frames)" % cloudlab.DEFAULT_MTU)
        p.add_argument("--gso-bursts", action="store_true",
                       help="let 64 KiB TCP/UDP segmentation bursts cross the links whole, so "
                            "a --drop loses a whole burst; default: "
                            "one packet per frame, as on a cloud wire")
        p.add_argument("--pin", action="store_true",
                       help="run every process of rank r on one CPU (r mod the CPUs we may "
                            "use; taskset), as if each rank had a host's CPU of its own; "
                            "default: the scheduler moves every thread across all CPUs")
        p.add_argument("--timeout", type=int, default=120,
                       help="the harness's rendezvous/operation timeout (s)")
        p.add_argument("--job-timeout", type=int, default=900,
                       help="kill the measured job after this many seconds")

    p = sub.add_parser("run", help="run any command in every rank's namespace")
    common(p)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- CMD ARGS; {rank} {size} {ip} {ns} {shared} {iface} are filled in")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("bench", help="run optireduce-bench on every rank")
    common(p)
    p.add_argument("--straggler-ms-dist", help="e.g. exp:5 (passed to the harness)")
    p.add_argument("algo")
    p.add_argument("harness_args", nargs=argparse.REMAINDER, help="more optireduce-bench flags")
    p.set_defaults(fn=cmd_bench)

    for name, fn, helptext in (("calibrate", cmd_calibrate, "p99/p50 per number of background jobs"),
                               ("experiment", cmd_experiment, "algorithms x environments + plots")):
        p = sub.add_parser(name, help=helptext)
        common(p)
        p.add_argument("--elements", type=int, default=1000000)
        p.add_argument("--iterations", type=int, default=200)
        p.add_argument("--straggler-ms-dist")
        p.add_argument("--seed", type=int, default=1,
                       help="seed of the straggler draws (the same schedule for every row)")
        p.add_argument("--warmup", type=int, default=5,
                       help="warm-up iterations before the timed ones (not timed)")
        if name == "calibrate":
            p.add_argument("--algo", default="allreduce_ring")
            p.add_argument("--bg-list", default="0,1,2,4,8")
            p.add_argument("--csv")
        else:
            p.add_argument("--algos", default="allreduce_ring,allreduce_ring_chunked,"
                           "allreduce_halving_doubling,allreduce_bcube,allreduce,transpose,"
                           "optireduce@udp",
                           help="comma-separated ALGO or ALGO@TRANSPORT (tcp, udp, dpdk; "
                                "default --transport), e.g. transpose@udp,optireduce@udp "
                                "(default: every Gloo algorithm, TAR, OptiReduce mode on udp)")
            p.add_argument("--env", action="append", required=True, metavar="NAME:K[:DIST]",
                           help="an environment: K background jobs and optionally a "
                                "straggler delay distribution, e.g. bg2:2 or slow:0:exp:30")
            p.add_argument("--out", required=True)
        p.set_defaults(fn=fn)

    p = sub.add_parser("cleanup", help="remove namespaces/links left by killed labs")
    p.add_argument("--owner", type=int, help="only the lab of this process id")
    p.set_defaults(fn=cmd_cleanup)
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--cleanup"]:  # the flag spelling of the cleanup subcommand
        argv[0] = "cleanup"
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if getattr(args, "harness_args", None) and args.harness_args[:1] == ["--"]:
        args.harness_args = args.harness_args[1:]
    if args.cmd != "cleanup":
        drop_specs(args, args.ranks)  # bad --drop/--drop-pattern: refused before any lab
    if args.cmd != "cleanup" and args.cmd != "run" and not os.access(args.bench_bin, os.X_OK):
        raise SystemExit("error: --bench-bin %s is not an executable (build optireduce-bench first)"
                         % args.bench_bin)
    cloudlab.install_signal_handlers()
    try:
        return args.fn(args)
    except KeyboardInterrupt as e:
        print("lab: interrupted (%s); torn down" % (e or "SIGINT"), file=sys.stderr)
        return 130
    except (RuntimeError, PermissionError, ValueError) as e:
        print("lab: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
