#!/usr/bin/python3
"""Generates the results page: runs the key experiments and writes bench/RESULTS.md, with
each experiment's CSVs and PNGs in its own folder under bench/results/ (bench/report.sh
builds first, then runs this).

  report.py [--quick] [--tta]
            [--only demo,sweep,loss,straggler,latency,failure,scaling,incast,tta]
            [--page bench/RESULTS.md] [--results bench/results]

Sections (folder under --results):
  demo       the main job's table (bench/demo.py): lab as root, else the local comparison
  sweep      optireduce-sweep: p50/p99 per size, Gloo's TCP vs our UDP and DPDK transports
  loss       lab.py experiment: 0, 0.1%, 1% random loss; 1% in bursts; 5% of acks (root only)
  straggler  lab.py experiment with an occasional and a every-iteration straggler (root only)
  latency    latency_bench: small messages, barrier, setup and teardown, Gloo's TCP vs ours
  failure    peer_death_bench: a peer's death to the survivors' exception, Gloo's TCP vs ours
  scaling    bench/scaling_model.py: ring, flat and 2D TAR measured at 2-16 local ranks, the
             model's costs fitted to them, its ratios to the measurements and its
             predictions to 1 024 ranks
  incast     bench/lab/incast.py: the receiver's drops and p99 of flat (and 2D) TAR with the
             owner's port open and rate-limited (root only)
  tta        bench/tta/tta.py time to accuracy: char LM and digits, 3 seeds, 4 ranks, and
             the char LM at 2 ranks (only with --tta or --only tta; otherwise kept from
             the last run that made it)

Every section says its command, the machine (CPUs, kernel) and when it was made; each
folder also keeps the section's text (section.md), so the page can be reassembled when
only some sections are rerun (--only). A rerun replaces a section's folder whole.
--quick: CI-sized runs (2 ranks, small buffers, few iterations), a few minutes in total.
"""

import argparse
import csv
import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(HERE, "lab"))
import cloudlab  # noqa: E402  (bench/lab/cloudlab.py: the lab's drop patterns)
SECTIONS = ["demo", "sweep", "loss", "straggler", "latency", "failure", "scaling", "incast",
            "tta"]
TITLES = {
    "demo": "The main job: one allreduce under loss and a straggler",
    "sweep": "Message sizes: Gloo's TCP vs our UDP and DPDK transports",
    "loss": "Packet loss",
    "straggler": "Stragglers",
    "latency": "Small messages and setup",
    "failure": "A peer dies: time to the survivors' exception",
    "scaling": "Scaling: ring, flat and 2D TAR, measured and modelled to 1 024 ranks",
    "incast": "Incast at the owner",
    "tta": "Time to accuracy (PyTorch DDP)",
}
ALGO_NAMES = {
    "allreduce_ring_chunked": "Gloo ring_chunked, Gloo TCP",
    "allreduce_ring_chunked@tcp": "Gloo ring_chunked, Gloo TCP",
    "transpose@udp": "TAR, our UDP",
    "optireduce@udp": "OptiReduce mode, our UDP",
}


def machine():
    cpus = os.cpu_count()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # Other jobs on the machine move p99 more than anything measured: say how busy it was
    # (load average over 1, 5 and 15 minutes when the section finished).
    load = "/".join("%.1f" % x for x in os.getloadavg())
    return "%d CPUs%s, Linux %s, load average %s" % (cpus, " (%s)" % model if model else "",
                                                     platform.release(), load)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def rel(path):
    return os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO) else path


def run(cmd, log_path, env=None, timeout=3600, ok_codes=(0,)):
    """Runs cmd; its stdout and stderr go to log_path; raises with the tail unless its exit
    status is one of ok_codes. Returns the exit status."""
    print("report: %s" % " ".join(shlex.quote(c) for c in cmd), flush=True)
    with open(log_path, "w") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                           timeout=timeout, cwd=REPO)
    if p.returncode not in ok_codes:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError("%s failed (rc %d):\n%s" % (" ".join(cmd), p.returncode, tail))
    return p.returncode


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def stamp(cmd, *more):
    """The section's command line(s), the machine and the time."""
    def shown(c):
        return " ".join(shlex.quote(rel(x)) if x.startswith("/") else shlex.quote(x) for x in c)
    cmds = [cmd] + list(more)
    return ["Command%s: %s  " % ("s" if more else "", ", ".join("`%s`" % shown(c) for c in cmds)),
            "Machine: %s; made %s." % (machine(), now()), ""]


def fmt_rel(v):
    return "-" if v in ("", None) else "%.2e" % float(v)


def lab_rows_md(summary, ref_algo=None, by_env=False):
    """Markdown rows of lab.py experiment's summary.csv, p99 relative to the first row of
    the same environment."""
    out, ref = [], {}
    for r in summary:
        p50, p99 = float(r["p50_us"]) / 1e3, float(r["p99_us"]) / 1e3
        ref.setdefault(r["env"], p99)
        row = ([r["env"]] if by_env else []) + [
            ALGO_NAMES.get(r["algo"], r["algo"]), "%.1f" % p50, "%.1f" % p99,
            "%.2f" % (p99 / p50), "%.2fx" % (p99 / ref[r["env"]]),
            "%.3f" % float(r["wire_loss_pct"]), "%.3f" % float(r["data_loss_pct"]),
            "%.1f" % float(r["damaged_pct"]), fmt_rel(r["rel_error"])]
        out.append(row)
    return out


LAB_HEADER = ["allreduce", "p50 ms", "p99 ms", "p99/p50", "p99 vs Gloo", "injected loss %",
              "deferred %", "damaged ops %", "rel. error"]


# ---- sections ------------------------------------------------------------------------
def section_demo(a, d):
    cmd = [PY, os.path.join(HERE, "demo.py"), "--bench-bin", a.bench_bin, "--out", d]
    if a.quick:
        cmd += ["--ranks", "2", "--iterations", "30", "--elements", "262144"]
    run(cmd, os.path.join(d, "log.txt"))
    summary = read_csv(os.path.join(d, "summary.csv"))
    with open(os.path.join(d, "table.txt")) as f:
        setup = [l[2:].strip() for l in f if l.startswith("# ")]
    lines = stamp(cmd) + [" ".join(setup), ""]
    lines += md_table(LAB_HEADER, lab_rows_md(summary))
    lines += ["", "p99 vs Gloo: this row's p99 over Gloo ring_chunked's. Injected loss: the "
              "share of packets the lab's drop lost while the row ran (the same drop for every "
              "row). Deferred: OptiReduce mode's mean share of the exact sum that missed its "
              "operation's deadline, carried into the next operation by its senders; damaged "
              "ops: the operations it flagged. Rel. error: "
              "of one more operation after the timed ones, against the exact sum.", "", "![latency CDF](%s)" % rel_link(a, d, "cdf.png"),
              "", "CSV: [summary](%s), [every iteration](%s)." % (
                  rel_link(a, d, "summary.csv"), rel_link(a, d, "samples.csv"))]
    return lines


def rel_link(a, d, name):
    return os.path.relpath(os.path.join(d, name), os.path.dirname(os.path.abspath(a.page)))


def section_sweep(a, d):
    """4 and 2 ranks (2 only with --quick), each in its own optireduce-sweep run
    (sweep-N.csv); sweep.csv holds both (its ranks column tells them apart)."""
    csv_path = os.path.join(d, "sweep.csv")
    algos = ("ring_chunked@tcp,ring_chunked@udp,ring_chunked@dpdk,transpose@tcp,"
             "transpose@udp,transpose@dpdk")
    sizes = "64K,1M" if a.quick else "4K,64K,1M,16M,64M"
    cmds, rows = [], []
    rank_counts = ["2"] if a.quick else ["4", "2"]
    for ranks in rank_counts:
        part = os.path.join(d, "sweep-%s.csv" % ranks)
        cmd = [a.sweep_bin, "--ranks", ranks, "--sizes", sizes, "--algos", algos, "--csv", part]
        cmd += ["--iters", "10"] if a.quick else ["--repeat", "3"]
        run(cmd, os.path.join(d, "log-%s.txt" % ranks))
        cmds.append(cmd)
        rows += read_csv(part)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["ranks"])
        w.writeheader()
        w.writerows(rows)
    lines = stamp(*[[rel_bin(c) for c in cmd] for cmd in cmds]) + [
        "Local ranks (processes on one host: loopback for TCP and UDP, a memif mesh for "
        "DPDK), %s of them on the machine's 2 cores; every result verified exact. "
        "Each row is the median of %s interleaved runs of every algorithm (p50: the run with "
        "the median p50; p99: the median p99). "
        "Ratio: p50 over ring_chunked@tcp's at that size and rank count, in the same run "
        "(below 1 is faster)." % (" and ".join(rank_counts), "1" if a.quick else "3"), ""]
    lines += md_table(["ranks", "size", "algorithm@transport", "p50 ms", "p99 ms", "bus GB/s",
                       "p50 vs ring_chunked@tcp"],
                      [[r["ranks"], size_label(int(r["bytes"])),
                        "%s@%s" % (r["algorithm"], r["transport"]),
                        "%.2f" % (float(r["p50_us"]) / 1e3), "%.2f" % (float(r["p99_us"]) / 1e3),
                        r["busbw_gbps"], r["ratio_vs_ring_chunked"]] for r in rows])
    plot_sweep(rows, os.path.join(d, "sweep.png"))
    lines += ["", "![p50 per size](%s)" % rel_link(a, d, "sweep.png"), "",
              "CSV: [sweep](%s)." % rel_link(a, d, "sweep.csv")]
    return lines


def rel_bin(c):
    return rel(c) if c.startswith("/") else c


def size_label(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def lab_experiment(a, d, tag, drop, envs, iterations, elements, pattern="random"):
    out = os.path.join(d, tag)
    cmd = [PY, os.path.join(HERE, "lab", "lab.py"), "experiment", "--ranks",
           "2" if a.quick else "4", "--elements", str(elements), "--iterations",
           str(iterations), "--warmup", "25", "--bench-bin", a.bench_bin,
           "--algos", "allreduce_ring_chunked,transpose@udp,optireduce@udp", "--out", out]
    for e in envs:
        cmd += ["--env", e]
    if drop:
        cmd += ["--drop", "all:%g" % drop]
        if pattern != "random":
            cmd += ["--drop-pattern", pattern]
    os.makedirs(out)
    env = dict(os.environ, OPTIREDUCE_START_GRACE="learned")
    run(cmd, os.path.join(out, "log.txt"), env=env)
    # lab.py writes its plots next to the CSVs; the page shows the CDF only.
    for extra in ("tail_ratio.png", "p99.png"):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    return cmd, read_csv(os.path.join(out, "summary.csv"))


def need_root(name):
    return ["Not generated: the %s table runs in the cloud lab (bench/lab), which needs root "
            "(network namespaces, veth pairs, tc)." % name]


def sizes(a):
    return (262144, 20) if a.quick else (4194304, 100)


# The loss section's runs: (environment name, P, --drop-pattern). Random loss at three
# rates, then the same 1% in bursts of 8 packets on average, then 5% of the small packets
# only (acks: pure TCP ACKs and our ack datagrams; data packets pass).
LOSS_RUNS = [("loss0%", 0.0, "random"), ("loss0.1%", 0.001, "random"),
             ("loss1%", 0.01, "random"), ("burst1%", 0.01, "burst:8"),
             ("acks5%", 0.05, "acks")]


def section_loss(a, d):
    if os.geteuid() != 0:
        return need_root("loss")
    elements, iters = sizes(a)
    lines, allrows = [], []
    for env, p, pattern in LOSS_RUNS:
        cmd, summary = lab_experiment(a, d, env.replace("%", ""), p, ["%s:0" % env], iters,
                                      elements, pattern)
        for r in summary:
            r["loss"] = p
            r["pattern"] = pattern
        allrows += summary
        if pattern == "random" and p:
            shown = cmd[:cmd.index("--env")] + ["--env", "NAME:0", "--drop", "all:P",
                                                "--drop-pattern", "PATTERN"]
    lines = stamp(shown) + [
        "One run per (P, PATTERN): no --drop; 0.001 and 0.01 random (each packet "
        "independently); 0.01 burst:8 (Gilbert-Elliott, runs of 8 packets on average); 0.05 "
        "acks (only packets of at most %d bytes: acks and small control packets, never "
        "MTU-sized data). "
        "%d ranks, one network namespace each, %.3g MiB buffers, %d timed iterations per row "
        "after 25 warm-up, OptiReduce start grace learned, no straggler. Resent / dropped: "
        "packets the ranks' transports resent over the run (Gloo TCP: the kernel's "
        "RetransSegs; ours: the engine's retransmissions and probes; OptiReduce mode "
        "repairs instead) over the packets the drop lost (a lost ack needs no resend). "
        "Spurious resends: resent packets the receivers reported they already had, so "
        "resent needlessly (Gloo TCP: the segments the peers DSACKed, the kernel's "
        "TCPDSACKRecvSegs; ours: the engine's resends and probes whose duplicate the ack "
        "reported). Both counts take in the harness's own barriers and broadcasts, which "
        "share the ranks' devices and namespaces, so OptiReduce mode rows, whose bounded "
        "data is repaired rather than resent, are not zero." %
        (cloudlab.DEFAULT_ACK_MAX_LEN, 2 if a.quick else 4, elements * 4 / 2.0**20, iters), ""]
    table = lab_rows_md(allrows, by_env=True)
    for row, r in zip(table, allrows):
        v = r.get("resent_per_dropped")
        row.append("%.2f" % float(v) if v not in ("", None) else "-")
        v = r.get("spurious_pkts")
        row.append("%d" % int(v) if v not in ("", None) else "-")
    lines += md_table(["loss"] + LAB_HEADER + ["resent / dropped", "spurious resends"], table)
    write_rows(os.path.join(d, "loss.csv"), allrows)
    plot_vs_loss([r for r in allrows if r["pattern"] == "random"],
                 os.path.join(d, "p99_vs_loss.png"))
    lines += ["", "![p99 per random loss rate](%s)" % rel_link(a, d, "p99_vs_loss.png"), "",
              "CSV: [all rows](%s); every iteration in each run's samples.csv." %
              rel_link(a, d, "loss.csv")]
    return lines


def section_straggler(a, d):
    if os.geteuid() != 0:
        return need_root("straggler")
    elements, iters = sizes(a)
    # 5% of the iterations straggle: 4x the iterations puts 20 spikes in a p99 (not 5).
    iters *= 4
    envs = ["spike:0:spike:0.05:80", "every:0:exp:30"]
    cmd, summary = lab_experiment(a, d, "lab", 0.0, envs, iters, elements)
    # A p99 of one run rests on a few of its slowest iterations, which the host's load moves:
    # the same experiment again, for the spread of each ratio.
    runs = [summary]
    for i in range(2, 2 if a.quick else STRAGGLER_RUNS + 1):
        runs.append(lab_experiment(a, d, "run%d" % i, 0.0, envs, iters, elements)[1])
        for name in os.listdir(os.path.join(d, "run%d" % i)):
            if name not in ("summary.csv", "log.txt"):
                os.remove(os.path.join(d, "run%d" % i, name))
    lines = stamp([rel_bin(c) for c in cmd]) + [
        "The last rank sleeps before each iteration: `spike` 80 ms before 5% of them (seeded, "
        "the same schedule for every row), `every` an exponential delay of mean 30 ms before "
        "every one (a rank slow every time: a bounded wait cannot absorb it, only fall "
        "behind). No loss; OptiReduce start grace learned.", ""]
    lines += md_table(["straggler"] + LAB_HEADER, lab_rows_md(summary, by_env=True))
    if len(runs) > 1:
        lines += ["", "The experiment run %d times in a row (the table above is the first): "
                  "p99 vs Gloo ring's p99 of the same run." % len(runs), ""]
        lines += md_table(["straggler", "allreduce", "p99 vs Gloo, each run", "mean ± sd"],
                          ratio_spread_rows(runs))
    lines += ["", "![latency CDF](%s)" % rel_link(a, d, os.path.join("lab", "cdf.png")), "",
              "CSV: [summary](%s)." % rel_link(a, d, os.path.join("lab", "summary.csv"))]
    return lines


STRAGGLER_RUNS = 3


def ratio_spread_rows(runs):
    """Rows of p99 over the first algorithm's p99 (same environment, same run) for every
    other algorithm, across runs of the same lab.py experiment."""
    ratios = {}  # env -> algo -> [ratio per run]
    for summary in runs:
        ref = {}  # env -> the p99 of its first row (Gloo ring)
        for r in summary:
            if r["env"] not in ref:
                ref[r["env"]] = float(r["p99_us"])
                continue
            ratios.setdefault(r["env"], {}).setdefault(r["algo"], []).append(
                float(r["p99_us"]) / ref[r["env"]])
    rows = []
    for env, by_algo in ratios.items():
        for algo, xs in by_algo.items():
            mean = sum(xs) / len(xs)
            sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
            rows.append([env, ALGO_NAMES.get(algo, algo), " / ".join("%.2fx" % x for x in xs),
                         "%.2f ± %.2f" % (mean, sd)])
    return rows


def section_latency(a, d):
    csv_path = os.path.join(d, "latency.csv")
    cmd = [a.latency_bin, "--ranks", "2", "--transports", "tcp,udp,dpdk", "--csv", csv_path]
    if a.quick:
        cmd += ["--iters", "200", "--setup-trials", "2"]
    run(cmd, os.path.join(d, "log.txt"))
    rows = read_csv(csv_path)
    tcp = {(r["what"], r["bytes"]): float(r["p50_us"]) for r in rows if r["transport"] == "tcp"}
    lines = stamp([rel_bin(c) for c in cmd]) + [
        "2 local ranks (processes on one host: loopback for TCP and UDP, a memif pair for "
        "DPDK), through the Gloo API. Ratio: p50 over Gloo TCP's for the same measurement "
        "(below 1 is faster).", ""]
    out = []
    for r in rows:
        ref = tcp.get((r["what"], r["bytes"]))
        p50 = float(r["p50_us"])
        out.append([r["transport"], r["what"], r["bytes"], "%.1f" % p50,
                    "%.1f" % float(r["p99_us"]), "%.2f" % (p50 / ref) if ref else "-"])
    lines += md_table(["transport", "measurement", "bytes", "p50 us", "p99 us",
                       "p50 vs Gloo TCP"], out)
    lines += ["", "CSV: [latency](%s)." % rel_link(a, d, "latency.csv")]
    return lines


def section_failure(a, d):
    csv_path = os.path.join(d, "peer_death.csv")
    cmd = [a.peer_death_bin, "--trials=%d" % (3 if a.quick else 10), "--devices=tcp,udp,dpdk",
           "--csv=" + csv_path]
    log = os.path.join(d, "log.txt")
    run(cmd, log)
    with open(log) as f:
        table = [l.rstrip("\n") for l in f if l.startswith("|")]
    shown = [rel_bin(c) for c in cmd[:-1]] + ["--csv=" + rel(csv_path)]
    lines = stamp(shown) + [
        "3 ranks (processes on one host), an allreduce loop, rank 2 dies between collectives "
        "(SIGKILL, op timeout 120 s; SIGSTOP: a process that stops answering, no FIN, no "
        "ICMP — not a death: the op timeout, 3 s, decides on every device); time from the "
        "death to each survivor's gloo::IoException. A killed "
        "process's sockets close only after the kernel freed its memory, so the last row "
        "runs Gloo TCP with a victim holding as much resident memory as the dpdk victims "
        "(their mbuf pools). The second table: a device with one live and one dead peer, "
        "idle for 2 s.", ""]
    for l in table:
        if l.startswith("| device | rank"):
            lines.append("")  # the idle table starts here
        lines.append(l)
    lines += ["", "CSV: [every sample](%s)." % rel_link(a, d, "peer_death.csv")]
    return lines


# The scaling section's measurement: rank counts and sizes (--quick: a check that it runs).
SCALING_RANKS, SCALING_SIZES, SCALING_REPEAT = "2,4,8,16", "256K,1M,4M,16M", "2"


def section_scaling(a, d):
    measured = os.path.join(d, "measured.csv")
    cmd = [PY, os.path.join(HERE, "scaling_model.py"), "measure", "--bench-bin", a.bench_bin,
           "--csv", measured]
    cmd += (["--ranks", "2,3", "--sizes", "256K", "--iterations", "3"] if a.quick else
            ["--ranks", SCALING_RANKS, "--sizes", SCALING_SIZES, "--repeat", SCALING_REPEAT])
    run(cmd, os.path.join(d, "log.txt"), timeout=3 * 3600)
    files = {k: os.path.join(d, k + ".csv") for k in ("fit", "check", "predictions")}
    model_cmd = [PY, os.path.join(HERE, "scaling_model.py"), "--measured", measured,
                 "--fit-csv", files["fit"], "--check-csv", files["check"],
                 "--csv", files["predictions"]]
    run(model_cmd, os.path.join(d, "model.txt"))
    with open(os.path.join(d, "model.txt")) as f:
        model_out = f.read()
    fit = read_csv(files["fit"])
    check = read_csv(files["check"])
    preds = read_csv(files["predictions"])
    meas = read_csv(measured)
    names = {"ring": "Gloo ring_chunked", "flat": "flat TAR", "2d": "2D TAR"}
    p = preds[0]
    lines = stamp([rel_bin(c) for c in cmd], [rel_bin(c) for c in model_cmd]) + [
        "Local ranks over our UDP on loopback (%s CPUs shared by all ranks), p50 of each "
        "point, the fastest of %s interleaved runs per point (the host's other work only "
        "slows a run down). The model: "
        "bench/README.md, \"Scaling model\"; its costs are fitted to these points." % (
            os.cpu_count(), "1" if a.quick else SCALING_REPEAT), ""]
    # Flat vs 2D TAR at 8 and 16 ranks (the largest measured rank counts in --quick).
    counts = sorted({int(r["ranks"]) for r in meas})
    shown = [n for n in counts if n in (8, 16)] or counts[-1:]
    by = {(r["algo"], int(r["ranks"]), int(r["bytes"])): r for r in check}
    rows = []
    for n in shown:
        for b in sorted({int(r["bytes"]) for r in meas}):
            flat, two, ring = by.get(("flat", n, b)), by.get(("2d", n, b)), by.get(("ring", n, b))
            ms = lambda r, k: "%.2f" % (float(r[k]) / 1e3) if r else "-"
            rows.append([n, size_label(b), ms(ring, "measured_us"), ms(flat, "measured_us"),
                         ms(two, "measured_us") if two else "not built",
                         "%.2f" % (float(two["measured_us"]) / float(flat["measured_us"]))
                         if two and flat else "-",
                         ms(flat, "model_us"), ms(two, "model_us") if two else "-"])
    lines += ["Measured, p50 ms (2D TAR: `optireduce-bench --layout 2d`, groups of the "
              "largest divisor at most √N; \"not built\" when the binary has no `--layout`):",
              ""]
    lines += md_table(["ranks", "size", "ring_chunked", "flat TAR", "2D TAR", "2D / flat",
                       "model flat", "model 2D"], rows)
    lines += ["", "Fitted costs (a per message, b' per byte, k the contention of ranks "
              "sharing a core; least squares on log(model / measured), non-negative; each "
              "algorithm to its own points):", ""]
    lines += md_table(["algorithm", "a µs", "b' ns/B", "k µs", "points", "rms rel. error"],
                      [[names[r["algo"]], "%.2f" % float(r["alpha_us"]),
                        "%.3f" % float(r["beta_ns_per_byte"]), "%.2f" % float(r["kappa_us"]),
                        r["points"], "%.2f" % float(r["rms_rel_err"]) if r["rms_rel_err"]
                        else "-"] for r in fit])
    inside = [r for r in check if 4 <= int(r["ranks"]) <= 16]
    ok = [r for r in inside if 0.7 <= float(r["ratio"]) <= 1.4]
    lines += ["", "Model / measured (p50), every measured point; %d of the %d points at 4-16 "
              "ranks are within 0.7-1.4 (the others are marked):" % (len(ok), len(inside)), ""]
    sizes_m = sorted({int(r["bytes"]) for r in check})
    rows = []
    for algo in ("ring", "flat", "2d"):
        for n in counts:
            cells = []
            for b in sizes_m:
                r = by.get((algo, n, b))
                if not r:
                    cells.append("-")
                    continue
                v = float(r["ratio"])
                cells.append("%.2f" % v + ("" if 0.7 <= v <= 1.4 else " ✗"))
            if any(c != "-" for c in cells):
                rows.append([names[algo], n] + cells)
    lines += md_table(["algorithm", "ranks"] + [size_label(b) for b in sizes_m], rows)
    want = {64, 256, 1024}
    rows = [[r["ranks"], names[r["algo"]], r["group"] if r["algo"] == "2d" else "-",
             r["messages"], r["fanin"], r["rounds"], size_label(int(r["msg_bytes"])),
             "%.1f" % (float(r["model_us"]) / 1e3)] for r in preds if int(r["ranks"]) in want]
    cross = [l for l in model_out.splitlines()
             if l.startswith(("2D TAR beats", "2D TAR is not"))]
    lines += ["", "Predicted for a cluster: a %s bucket, one core per rank, %s Gbit/s links, "
              "the fitted costs (per byte: the larger of b' and the link's), 10 µs one-way "
              "latency per dependent step, no loss. Per rank: messages sent, incast fan-in "
              "(senders into one receiver at once), rounds, the largest message:" % (
                  size_label(int(p["bucket"])), p["link_gbps"]), ""]
    lines += md_table(["ranks", "algorithm", "G", "messages", "fan-in", "rounds",
                       "largest message", "model ms"], rows)
    lines += ["", (cross[0] if cross else "") + " Every rank count from 2 to 1 024: "
              "[predictions](%s)." % rel_link(a, d, "predictions.csv")]
    plot_scaling(preds, os.path.join(d, "scaling.png"))
    lines += ["", "![the model's time per rank count](%s)" % rel_link(a, d, "scaling.png"),
              "", "CSV: [measured](%s), [fitted costs](%s), [model vs measured](%s)." % (
                  rel_link(a, d, "measured.csv"), rel_link(a, d, "fit.csv"),
                  rel_link(a, d, "check.csv"))]
    return lines


def section_incast(a, d):
    if os.geteuid() != 0:
        return need_root("incast")
    csv_path = os.path.join(d, "incast.csv")
    cmd = [PY, os.path.join(HERE, "lab", "incast.py"), "--bench-bin", a.bench_bin,
           "--csv", csv_path]
    if a.quick:
        cmd += ["--ranks", "4", "--sizes", "256K", "--iterations", "5", "--warmup", "2"]
    run(cmd, os.path.join(d, "log.txt"), timeout=3 * 3600)
    rows = read_csv(csv_path)
    lines = stamp([rel_bin(c) for c in cmd]) + [
        "TAR over our UDP in the cloud lab (one network namespace per rank, %d CPUs), exact "
        "(`transpose`) and in OptiReduce mode (`optireduce`: every timed operation bounded, "
        "after its calibrations), every rank's shard sent by every other rank at once; in 2D "
        "TAR the owners of phase B receive from N/G - 1 ranks, of phases A and C from G - 1. "
        "Link: `open`, or a tbf rate limit "
        "with a small queue on the bridge port towards rank 0 (the constrained owner). "
        "Drops over the whole run (warm-up included), all in rank 0's namespace unless "
        "named: the kernel's UDP RcvbufErrors (socket buffer full), the tbf queue's drops, "
        "eth0's rx drops; resent: packets every rank's engine resent. p50/p99: rank 0's "
        "per-iteration time." % os.cpu_count(), ""]
    out = []
    for r in rows:
        head = [r["algo"], r["layout"] + (" (G=%s)" % r["group"] if r["layout"] == "2d" else ""),
                r["ranks"], size_label(int(r["bytes"])), r["link"]]
        if r["status"] != "ok":
            out.append(head + [r["status"]] + ["-"] * 6)
            continue
        out.append(head + [r["p50_ms"], r["p99_ms"], r["owner_rcvbuf_errors"],
                           r["all_rcvbuf_errors"], r["owner_queue_drops"],
                           r["owner_if_rx_drops"], r["resent_pkts"] or "-"])
    lines += md_table(["algorithm", "layout", "ranks", "size", "link", "p50 ms", "p99 ms",
                       "RcvbufErrors", "RcvbufErrors, all ranks", "queue drops", "rx drops",
                       "resent pkts"], out)
    lines += ["", "CSV: [incast](%s)." % rel_link(a, d, "incast.csv")]
    return lines


# The tta section's runs: (folder, workload, ranks, extra tta.py flags). The 4-rank runs
# are the comparison; the 2-rank run repeats the environments where a time needs one core
# per rank (this host has 2) for the configurations compared there.
TTA_RUNS = [
    ("charlm", "charlm", 4, []),
    ("charlm-2ranks", "charlm", 2, ["--configs", "ring,optireduce", "--env", "loss1:none@0.01",
                                    "--env", "straggler:spike:0.05:80"]),
    ("digits", "digits", 4, []),
]
TTA_SEEDS = "1,2,3"
# --tta-scope core: what fits in about an hour on this host — the char LM at 4 ranks, ring
# vs OptiReduce mode, no fault, 1% loss and the straggler, the same 3 seeds, and its
# 2-rank times as in the full scope.
TTA_RUNS_CORE = [
    ("charlm", "charlm", 4, ["--configs", "ring,optireduce", "--env", "lossless:none",
                             "--env", "loss1:none@0.01", "--env", "straggler:spike:0.05:80"]),
    TTA_RUNS[1],
]


def fmt_pm(v, e, digits):
    return "%.*f ± %.*f" % (digits, float(v), digits, float(e))


def section_tta(a, d):
    import time

    cmds, tables = [], {}
    started = time.monotonic()
    tta_runs = TTA_RUNS_CORE if a.tta_scope == "core" else TTA_RUNS
    for folder, workload, ranks, extra in tta_runs:
        if a.quick and folder == "charlm-2ranks":
            continue  # --quick runs 2 ranks throughout
        out = os.path.join(d, folder)
        cmd = [PY, os.path.join(HERE, "tta", "tta.py"), "--workload", workload, "--out", out,
               "--check-replicas"]
        cmd += ["--quick", "--ranks", "2"] if a.quick else \
            ["--ranks", str(ranks), "--seeds", TTA_SEEDS] + extra
        if os.geteuid() == 0:
            cmd.append("--lab")
        if a.torch_lib:
            cmd += ["--torch-lib", a.torch_lib]
        os.makedirs(out)
        # Exit status 3: every job ran, some failed; their rows say why (shown below).
        run(cmd, os.path.join(out, "log.txt"), timeout=6 * 3600, ok_codes=(0, 3))
        cmds.append([rel_bin(c) for c in cmd])
        tables[folder] = read_csv(os.path.join(out, "tta_summary.csv"))
    minutes = (time.monotonic() - started) / 60
    two = {(r["env"], r["config"]): r for r in tables.get("charlm-2ranks", [])}
    lines = stamp(*cmds) + [
        "Each (environment, seed, configuration) is a fresh torch.distributed DDP job "
        "(bench/tta, %s). Workloads: `charlm`, a 2-layer character-level transformer "
        "language model trained on Python's standard-library sources, metric validation "
        "loss in nats (lower is better); `digits`, an MLP on sklearn's digits, metric test "
        "accuracy in %%. %s Configurations: stock Gloo "
        "ring over Gloo's TCP, TAR over our UDP (exact, retransmits), OptiReduce mode. "
        "Per row over the seeds: the final metric of rank 0 (mean ± sd), the worst final "
        "metric of any rank in any seed, the largest replica divergence max_r "
        "‖θr−θ0‖/‖θ0‖ of the final parameters, the steps where the ranks' parameter hashes "
        "differed (checked after every step), the seeds that reached the target, the mean "
        "training time to it (when every seed reached it) and ring's time over this one "
        "(speed-up). This section took %.0f minutes." % (
            "ranks in lab namespaces, real packet loss" if os.geteuid() == 0 else
            "local processes; loss is injected into our UDP transport only",
            "Quick run: 2 ranks, one seed, a small model, one environment (a straggler "
            "sleeping exp:10 ms and 1%% loss)." if a.quick else
            "Core scope (`--tta-scope core`, about an hour here): the char LM only, Gloo "
            "ring vs OptiReduce mode, no fault, 1%% packet loss%s and the last rank sleeping "
            "80 ms before 5%% of the steps; the full scope adds TAR, digits and congestion "
            "(hours on this host)." % (" on every link" if os.geteuid() == 0 else "")
            if a.tta_scope == "core" else
            "Environments: no fault; 1%% packet loss%s; the last rank sleeping 80 ms before "
            "5%% of the steps%s." % (
                " on every link" if os.geteuid() == 0 else "",
                "; congestion (a background allreduce job on the same links and CPUs)"
                if os.geteuid() == 0 else ""), minutes), "",
        "This host has 2 cores: with 4 ranks two share a core, so every step also waits for "
        "a core and a rank the scheduler holds back is a straggler to every configuration. "
        "Times (time to target, speed-up) are therefore also given at 2 ranks, one per "
        "core, for the loss and straggler environments (columns *2 ranks*). Backward "
        "compute runs inside the measured sync time (DDP overlaps it with the allreduces). "
        "*Fault's cost to ring*: ring's time to target in that environment over its time "
        "with no fault, the speed-up over ring that an allreduce hiding the fault completely "
        "(at ring's fault-free speed) would get: where it is below a target speed-up, no "
        "allreduce reaches that target on this workload and host."
        if not a.quick else "This host has 2 cores.", ""]
    for folder, workload, _, _ in tta_runs:
        rows = tables.get(folder)
        if not rows or folder == "charlm-2ranks":
            continue
        r0 = rows[0]
        digits = 2 if workload == "digits" else 3
        failed = [r for r in read_csv(os.path.join(d, folder, "tta_runs.csv"))
                  if r["status"] != "ok"]
        lines += ["### %s: %s, target %s" % (
            workload, "validation loss (nats)" if workload == "charlm" else "test accuracy (%)",
            r0["target"]), ""]
        with_two = workload == "charlm" and bool(two)
        header = ["env", "config", "ranks", "final (mean ± sd)", "worst replica", "divergence",
                  "mismatched steps", "reached", "to target s", "speed-up"]
        header += ["to target s, 2 ranks", "speed-up, 2 ranks"] if with_two else []
        # What the environment costs ring: the speed-up over ring that an allreduce hiding
        # the fault completely (at ring's own fault-free speed) would get.
        ring_time = {r["env"]: float(r["time_to_target_s"]) for r in rows
                     if r["config"] == "ring" and r["time_to_target_s"]}
        with_cost = "lossless" in ring_time and len(ring_time) > 1
        header += ["fault's cost to ring"] if with_cost else []
        header += ["sync p50 / p99 ms"]
        body = []
        for r in rows:
            if not r["final_mean"]:
                body.append([r["env"], r["config"], r["ranks"], "every job failed"] +
                            [""] * (len(header) - 4))
                continue
            row = [r["env"], r["config"], r["ranks"],
                   fmt_pm(r["final_mean"], r["final_sd"], digits),
                   "%.*f" % (digits, float(r["final_worst_replica"])), r["divergence_max"],
                   "%s / %s" % (r["mismatched_steps"], r["checked_steps"]), r["reached"],
                   fmt_pm(r["time_to_target_s"], r["time_to_target_sd"], 1)
                   if r["time_to_target_s"] else "-", r["speedup_vs_ring"] or "-"]
            if with_two:
                t2 = two.get((r["env"], r["config"]))
                row += [(fmt_pm(t2["time_to_target_s"], t2["time_to_target_sd"], 1)
                         if t2["time_to_target_s"] else "-") if t2 else "",
                        (t2["speedup_vs_ring"] or "-") if t2 else ""]
            if with_cost:
                row.append("%.2fx" % (ring_time[r["env"]] / ring_time["lossless"])
                           if r["config"] == "ring" and r["env"] in ring_time else "")
            row.append("%.0f / %.0f" % (float(r["sync_p50_ms"]), float(r["sync_p99_ms"])))
            body.append(row)
        lines += md_table(header, body)
        if failed:
            lines += ["", "Failed jobs (not in the means; *reached* counts them as not "
                      "reaching the target): " + "; ".join(
                          "%s / %s / seed %s: `%s`" % (r["env"], r["config"], r["seed"],
                                                       r["error"]) for r in failed) + "."]
        if workload == "charlm":
            se = max(float(r["final_se"]) for r in rows if r["final_se"])
            runs = [r for r in read_csv(os.path.join(d, folder, "tta_runs.csv"))
                    if r["status"] == "ok"]
            lines += ["", "Validation set: 256 windows of one training context each, from files no "
                      "training window comes from; the standard error of one model's "
                      "validation loss over such windows is at most %.3f nats here (the "
                      "same windows score every model, so differences between rows are "
                      "measured more precisely than that). Corpus SHA-256 %s." % (
                          se, runs[0]["corpus_sha256"][:16] + "…")]
        lines += ["", "![%s: metric vs time](%s)" % (workload, rel_link(a, d, os.path.join(
            folder, "tta.png"))), "",
            "CSV: [summary](%s), [every job](%s), [curves](%s)." % tuple(
                rel_link(a, d, os.path.join(folder, n))
                for n in ("tta_summary.csv", "tta_runs.csv", "tta_curve.csv")), ""]
    if two:
        lines += ["2-rank runs: [summary](%s), ![charlm, 2 ranks](%s)" % (
            rel_link(a, d, os.path.join("charlm-2ranks", "tta_summary.csv")),
            rel_link(a, d, os.path.join("charlm-2ranks", "tta.png")))]
    return lines


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


# ---- plots ---------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_plot(series, path, xlabel, ylabel, xscale):
    """One line per series (name -> [(x, y)]), log y, the page's figure size and style."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, linewidth=1.2)
    ax.set_xscale(*xscale[:1], **xscale[1])
    ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_sweep(rows, path):
    series = {}
    for r in rows:
        series.setdefault("%s@%s, %s ranks" % (r["algorithm"], r["transport"], r["ranks"]),
                          []).append((int(r["bytes"]), float(r["p50_us"]) / 1e3))
    _log_plot(series, path, "buffer (bytes)", "p50 allreduce time (ms)", ("log", {"base": 2}))


def plot_scaling(preds, path):
    """The model's time of one allreduce per rank count, one line per algorithm."""
    names = {"ring": "Gloo ring_chunked", "flat": "flat TAR", "2d": "2D TAR"}
    series = {}
    for r in preds:
        series.setdefault("model, " + names[r["algo"]], []).append(
            (int(r["ranks"]), float(r["model_us"]) / 1e3))
    _log_plot(series, path, "ranks", "model time of one allreduce (ms)", ("log", {"base": 2}))


def plot_vs_loss(rows, path):
    series = {}
    for r in rows:
        series.setdefault(ALGO_NAMES.get(r["algo"], r["algo"]), []).append(
            (100 * r["loss"], float(r["p99_us"]) / 1e3))
    _log_plot(series, path, "per-packet loss (%)", "p99 allreduce time (ms)",
              ("symlog", {"linthresh": 0.1}))


# ---- the page ------------------------------------------------------------------------
def assemble(a):
    page = ["# Results", "",
            "Generated by `bench/report.sh%s` — do not edit; rerun it. Each section names its "
            "command, the machine and when it was made; its CSVs and PNGs are in "
            "`%s/<section>/`. How to run each tool and what its columns mean: "
            "[README.md](README.md)." % (" --quick" if a.quick else "", rel(a.results)), ""]
    if a.quick:
        page += ["**Quick run** (`--quick`: 2 ranks, small buffers, few iterations): checks "
                 "that the experiments run; its numbers are not measurements.", ""]
    for s in SECTIONS:
        md = os.path.join(a.results, s, "section.md")
        page += ["## %s" % TITLES[s], ""]
        if os.path.exists(md):
            with open(md) as f:
                page += f.read().rstrip("\n").split("\n")
        else:
            page += ["Not generated%s." % (" (run `bench/report.sh --tta`)" if s == "tta" else "")]
        page.append("")
    with open(a.page, "w") as f:
        f.write("\n".join(page))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI-sized runs (a few minutes)")
    ap.add_argument("--tta", action="store_true", help="also run time to accuracy")
    ap.add_argument("--tta-scope", choices=["full", "core"], default="full",
                    help="tta: every workload, configuration and environment (hours), or "
                         "the char LM's core comparison (about an hour)")
    ap.add_argument("--only", help="comma-separated sections to rerun (default: all but tta; "
                                   "tta with --tta)")
    ap.add_argument("--page", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    build = os.environ.get("OPTIREDUCE_BUILD_DIR", os.path.join(REPO, "build"))
    ap.add_argument("--bench-bin", default=os.path.join(build, "bench", "optireduce-bench"))
    ap.add_argument("--sweep-bin", default=os.path.join(build, "bench", "optireduce-sweep"))
    ap.add_argument("--latency-bin", default=os.path.join(build, "bench", "latency_bench"))
    ap.add_argument("--peer-death-bin", default=os.path.join(build, "bench", "peer_death_bench"))
    ap.add_argument("--torch-lib", help="liboptireduce_torch.so for tta (default: tta.py's)")
    a = ap.parse_args(argv)
    if a.only:
        a.sections = [s for s in a.only.split(",") if s]
        bad = [s for s in a.sections if s not in SECTIONS]
        if bad:
            ap.error("--only: unknown section '%s' (allowed: %s)" % (bad[0], ", ".join(SECTIONS)))
    else:
        a.sections = [s for s in SECTIONS if s != "tta" or a.tta]
    for b in (a.bench_bin, a.sweep_bin, a.latency_bin, a.peer_death_bin):
        if not os.access(b, os.X_OK):
            ap.error("%s is not an executable (./scripts/build.sh builds it)" % b)
    a.page = os.path.abspath(a.page)
    a.results = os.path.abspath(a.results)
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(a.results, exist_ok=True)
    fns = dict(demo=section_demo, sweep=section_sweep, loss=section_loss,
               straggler=section_straggler, latency=section_latency,
               failure=section_failure, scaling=section_scaling, incast=section_incast,
               tta=section_tta)
    failed = []
    for s in a.sections:
        d = os.path.join(a.results, s)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        try:
            lines = fns[s](a, d)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print("report: %s failed: %s" % (s, e), file=sys.stderr)
            failed.append(s)
            lines = ["**Failed** when run %s: see `%s`." % (now(), rel(os.path.join(d, "log.txt")))]
        with open(os.path.join(d, "section.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    # Nothing but the sections' folders lives in bench/results (another --results is the
    # caller's folder: left as it is).
    default = os.path.abspath(os.path.join(HERE, "results"))
    for name in os.listdir(a.results) if a.results == default else []:
        if name not in SECTIONS:
            p = os.path.join(a.results, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    assemble(a)
    print("report: wrote %s and %s/" % (rel(a.page), rel(a.results)))
    if failed:
        print("report: failed sections: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
