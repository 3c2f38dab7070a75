#!/usr/bin/python3
"""Time to accuracy of DDP training: stock Gloo ring vs TAR vs OptiReduce mode, under tails.

Each (environment, seed, configuration) is a fresh torch.distributed job of --ranks ranks
(local processes on 127.0.0.1, or with --lab one per network namespace of bench/lab;
file:// rendezvous) training one workload (tta_worker.py):

  digits      an MLP on sklearn's digits (digits.py); metric: test accuracy in %
  charlm      a character-level transformer language model on Python's standard-library
              sources (charlm.py); metric: validation loss in nats (lower is better)

Configurations:

  ring        stock Gloo ring allreduce over Gloo's TCP (optireduce not loaded)
  tar         GLOO_ALGO=transpose: TAR (reliable, exact) over Gloo's TCP, optireduce loaded
  tar_udp     GLOO_ALGO=transpose over GLOO_DEVICE_TRANSPORT=UDP: TAR over our UDP transport,
              which retransmits what is lost (an environment's injected loss applies)
  optireduce  GLOO_ALGO=optireduce over GLOO_DEVICE_TRANSPORT=UDP (bounded OptiReduce mode);
              without --lab an environment's injected loss (OPTIREDUCE_FAULTS drop=P)
              applies here and to tar_udp only (Gloo's TCP cannot lose packets on loopback)

Environments (--env NAME:DIST[@LOSS][+bgK], repeatable): rank `--straggler-rank` sleeps a
delay drawn from DIST (none, const:X, exp:MEAN, uniform:A:B, normal:MEAN:STD,
pareto:SCALE:SHAPE, spike:P:MS; ms) before each step; LOSS is the injected receive loss of
our UDP transport (with --lab: real packet loss on every rank's link, for every config);
+bgK (--lab only) runs K background allreduce jobs over the same links (congestion).

Output: a progress line per evaluation, a table per (env, config) over the seeds, and in
--out: tta_curve.csv (every evaluation of rank 0), tta_runs.csv (one row per job),
tta_summary.csv (one row per env and config: mean and sd over the seeds, worst replica,
replica divergence, time to target, speed-up over ring), tta.png (metric vs wall-clock,
one panel per env). bench/README.md lists every column.

  tta.py                                          # digits, the default environments
  tta.py --workload charlm --seeds 1,2,3          # the char LM, 3 seeds
  tta.py --quick --out /tmp/tta                   # a small run (tests)
  tta.py --workload charlm --quick --ranks 2 --configs optireduce --check-replicas
  tta.py calibrate --dists none,exp:15,exp:60 --epochs 4   # Gloo ring p99/p50 per DIST
  tta.py --lab                                    # ranks in bench/lab namespaces (root)
"""

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import queue
import re
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import dists  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lab"))
import cloudlab  # noqa: E402
import lab as labtool  # noqa: E402  (bench/lab/lab.py: background jobs)

PYTHON = "/usr/bin/python3"
WORKER = os.path.join(HERE, "tta_worker.py")
CONFIGS = {
    "ring": "Gloo ring, TCP",
    "tar": "TAR, TCP",
    "tar_udp": "TAR, our UDP",
    "optireduce": "OptiReduce mode, UDP",
}
GLOO_ALGO = {"tar": "transpose", "tar_udp": "transpose", "optireduce": "optireduce"}
OUR_UDP = ("tar_udp", "optireduce")  # over GLOO_DEVICE_TRANSPORT=UDP, where loss is injected
WORKLOADS = {
    "digits": "MLP 64-H-H-10 on sklearn's digits, test accuracy %",
    "charlm": "char-level transformer LM on Python's stdlib sources, validation loss (nats)",
}
# Per workload: defaults of the flags left unset, then what --quick changes.
DEFAULTS = {
    "digits": dict(epochs=10, hidden=1024, batch=16, lr=0.05, target=95.0, timeout=300.0),
    "charlm": dict(steps=300, d_model=64, layers=2, heads=4, context=64, batch=8, lr=3e-3,
                   target=2.25, eval_every=20, timeout=900.0),
}
QUICK = {
    "digits": dict(epochs=3, hidden=256, target=85.0, timeout=60.0),
    "charlm": dict(steps=24, d_model=32, layers=1, context=32, batch=8, target=3.0,
                   eval_every=8, timeout=120.0),
}
# The environments of the comparison: no fault, 1% packet loss, an occasional straggler
# (80 ms before 5% of the steps, as in the results page's straggler table) and, in the
# lab, congestion (one background allreduce job with idle gaps over the same links).
DEFAULT_ENVS = ["lossless:none", "loss1:none@0.01", "straggler:spike:0.05:80"]
LAB_ENVS = ["congestion:none+bg1"]
QUICK_ENVS = ["tail:exp:10@0.01"]
# Background jobs (+bgK): lab.py's, a 4 MB Gloo ring allreduce over Gloo's TCP with an idle
# gap of exp:20 ms before each, so they load the links and CPUs in bursts.
BG_ELEMENTS = 1000000
BG_GAP = "exp:20"


class UsageError(Exception):
    pass


# tta.py's exit status when every job ran but some failed (their rows say why).
FAILED_JOBS = 3


class JobError(Exception):
    """A training job failed or timed out (message has the ranks' exit codes and logs)."""


def parse_env(spec):
    """NAME:DIST[@LOSS][+bgK] -> (name, dist, loss, background jobs)."""
    what = "--env"
    if ":" not in spec:
        raise UsageError("%s: '%s' is not NAME:DIST[@LOSS][+bgK] (e.g. tail3:exp:45@0.01)"
                         % (what, spec))
    name, rest = spec.split(":", 1)
    bg = 0
    if "+bg" in rest:
        rest, bg_s = rest.rsplit("+bg", 1)
        if not bg_s.isdigit() or not 1 <= int(bg_s) <= 8:
            raise UsageError("%s: '%s' has '+bg%s'; allowed: +bgK with K background jobs, "
                             "1..8" % (what, spec, bg_s))
        bg = int(bg_s)
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise UsageError("%s: '%s' needs a name of letters, digits, '-' or '_'" % (what, spec))
    loss = 0.0
    if "@" in rest:
        rest, loss_s = rest.rsplit("@", 1)
        try:
            loss = float(loss_s)
        except ValueError:
            loss = -1
        if not 0 <= loss < 1:
            raise UsageError("%s: '%s' has loss '%s'; allowed: a number in [0, 1)" % (what, spec, loss_s))
    try:
        dists.parse(rest, what="--env %s" % name)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return name, rest, loss, bg


def torch_lib(args):
    path = args.torch_lib or os.environ.get("OPTIREDUCE_TORCH_LIB") or \
        os.path.join(REPO, "build", "gloo_ext", "liboptireduce_torch.so")
    if not os.path.isfile(path):
        raise UsageError("--torch-lib: liboptireduce_torch.so not found at %s (build target "
                         "optireduce_torch or set OPTIREDUCE_TORCH_LIB)" % path)
    return path


def rank_env(config, loss, lib, seed, repair_budget=None, start_grace=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GLOO_", "OPTIREDUCE_")) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.path.join(REPO, "gloo_ext", "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if config != "ring":
        env["OPTIREDUCE_TORCH_LIB"] = lib
    if config in GLOO_ALGO:
        env["GLOO_ALGO"] = GLOO_ALGO[config]
    if config in OUR_UDP:
        env["GLOO_DEVICE_TRANSPORT"] = "UDP"
        if loss > 0:
            env["OPTIREDUCE_FAULTS"] = "drop=%g,seed=%d" % (loss, seed)
    if config == "optireduce":
        if repair_budget is not None:
            env["OPTIREDUCE_REPAIR_BUDGET"] = "%g" % repair_budget
        if start_grace is not None:
            env["OPTIREDUCE_START_GRACE"] = start_grace
    return env


class Job:
    """`world` worker processes; kills and reaps all of them on close()."""

    def __init__(self, world, env, settings, workdir, lab=None):
        self.procs, self.logs = [], []
        self.outs = [os.path.join(workdir, "out%d.json" % r) for r in range(world)]
        init = "file://" + os.path.join(workdir, "store")
        for r in range(world):
            log = open(os.path.join(workdir, "log%d.txt" % r), "w+")
            self.logs.append(log)
            cmd = [PYTHON, WORKER, str(r), str(world), init, self.outs[r],
                   "--settings", json.dumps(settings)]
            out = subprocess.PIPE if r == 0 else log
            if lab is None:
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=log, text=True,
                                                   start_new_session=True))
            else:
                # `ip netns exec` keeps the caller's environment: pass the rank's through env(1).
                # Gloo (TCP) and the UDP device both use the namespace's eth0.
                rank_vars = dict(env, GLOO_SOCKET_IFNAME="eth0")
                cmd = ["env", "-i"] + ["%s=%s" % kv for kv in sorted(rank_vars.items())] + cmd
                p = lab.spawn(r, cmd, stdout=out, stderr=log)
                self.procs.append(p)
        if lab is not None and self.procs[0].stdout is not None:
            import io
            self.procs[0].stdout = io.TextIOWrapper(self.procs[0].stdout)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def tail_logs(self, n=1500):
        out = []
        for r, log in enumerate(self.logs):
            log.flush()
            log.seek(0)
            out.append("--- rank %d ---\n%s" % (r, log.read()[-n:]))
        return "\n".join(out)

    def close(self):
        self.kill()
        if self.procs and self.procs[0].stdout:
            self.procs[0].stdout.close()
        for log in self.logs:
            log.close()


def percentile(v, p):
    s = sorted(v)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def better(args, a, b):
    """True when metric a is at least as good as b (the target, or another metric)."""
    return a >= b if args.workload == "digits" else a <= b


def worst(args, values):
    return min(values) if args.workload == "digits" else max(values)


def divergence(param_files):
    """max over ranks r of ||theta_r - theta_0|| / ||theta_0|| of the final parameters."""
    import numpy as np

    thetas = [np.fromfile(p, dtype=np.float64) for p in param_files]
    if any(t.shape != thetas[0].shape for t in thetas):
        raise JobError("ranks wrote parameter vectors of different lengths: %s"
                       % [t.shape[0] for t in thetas])
    norm = float(np.linalg.norm(thetas[0]))
    return max(float(np.linalg.norm(t - thetas[0])) for t in thetas) / norm if norm else 0.0


def worker_settings(args, config, dist_spec, seed):
    s = {"workload": args.workload, "import_optireduce": config != "ring",
         "batch": args.batch, "bucket_mb": args.bucket_mb, "lr": args.lr,
         "eval_every": args.eval_every, "straggler": dist_spec,
         "straggler_rank": args.straggler_rank, "seed": seed, "op_timeout_s": args.timeout,
         "resync_every": args.resync_every if config == "optireduce" else 0,
         "check_replicas": args.check_replicas}
    if args.workload == "digits":
        s.update(epochs=args.epochs, hidden=args.hidden)
    else:
        s.update(steps=args.steps, d_model=args.d_model, layers=args.layers, heads=args.heads,
                 context=args.context)
    return s


def start_background(args, lab, bg):
    """K background allreduce jobs over every rank's link (lab.py's), a fresh store each."""
    import types

    opts = types.SimpleNamespace(bg=bg, bg_algo="allreduce_ring", bg_elements=BG_ELEMENTS,
                                 bg_gap_ms_dist=BG_GAP, bg_settle=1.0, bench_bin=args.bench_bin,
                                 transport="tcp", timeout=120)
    try:
        return labtool.start_background(lab, opts)
    except RuntimeError as e:
        raise JobError("background jobs: %s" % e) from None


def run_one(args, env, seed, config, lib, progress=True):
    """One training job; returns (curve rows, the run's summary row)."""
    env_name, dist_spec, loss, bg = env
    settings = worker_settings(args, config, dist_spec, seed)
    workdir = tempfile.mkdtemp(prefix="optireduce-tta-")
    job = None
    lab = None
    try:
        if args.lab:
            # A fresh lab per job (as lab.py experiment does); the loss is real packet loss
            # on every rank's incoming link (tc eBPF), so it hits every configuration.
            lab = cloudlab.Lab(args.ranks)
            for r in range(args.ranks):
                if loss > 0:
                    lab.set_drop(r, loss, "in")
            if bg:
                start_background(args, lab, bg)
            env_vars = rank_env(config, 0.0, lib, seed, args.repair_budget, args.start_grace)
        else:
            env_vars = rank_env(config, loss, lib, seed, args.repair_budget, args.start_grace)
        job = Job(args.ranks, env_vars, settings, workdir, lab)
        deadline = time.monotonic() + args.timeout
        curve = []
        label = "%-10s %-10s seed %d" % (env_name, config, seed)
        # Rank 0's stdout: EVAL lines, read by a thread so that a rank that hangs without
        # printing cannot block us past the deadline (the job is then killed below).
        lines = queue.Queue()

        def pump(stream):
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, args=(job.procs[0].stdout,), daemon=True).start()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                break
            parts = line.split()
            if len(parts) == 5 and parts[0] == "EVAL":
                step, wall, value = int(parts[1]), float(parts[3]), float(parts[4])
                curve.append({"workload": args.workload, "config": config, "env": env_name,
                              "seed": seed, "wall_s": wall, "step": step, "metric": value})
                if progress:
                    print("  %s step %4d  t=%7.1fs  %s %.3f"
                          % (label, step, wall, args.metric, value), flush=True)
        codes = []
        for p in job.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                job.kill()
                codes.append("timeout")
        if codes != [0] * args.ranks:
            raise JobError("env %s, config %s, seed %d: ranks exited %s (a rank still running "
                           "after --timeout %g s is killed)\n%s"
                           % (env_name, config, seed, codes, args.timeout, job.tail_logs()))
        results = []
        for path in job.outs:
            with open(path) as f:
                results.append(json.load(f))
        div = divergence([p + ".params" for p in job.outs])
    finally:
        if job is not None:
            job.close()
        if lab is not None:
            lab.close()
        shutil.rmtree(workdir, ignore_errors=True)
    r0 = results[0]
    # Skip the first steps: DDP rebuilds its buckets after step 1 and the first
    # connections/calibration are warm-up, not the steady state.
    sync = r0["sync_ms"][min(5, len(r0["sync_ms"]) // 4):]
    hit = next((c for c in curve if better(args, c["metric"], args.target)), None)
    finals = [r["final_metric"] for r in results]
    summary = {
        "status": "ok", "error": "",
        "workload": args.workload, "metric": r0["metric_name"], "config": config,
        "env": env_name, "seed": seed, "ranks": args.ranks, "straggler": dist_spec,
        "loss": loss if (config in OUR_UDP or args.lab) else 0.0, "bg_jobs": bg,
        # As the library parsed it (OPTIREDUCE_REPAIR_BUDGET), not as this script meant it.
        "repair_budget": (r0.get("config") or {}).get("repair_budget", "")
                         if config == "optireduce" else "",
        "start_grace": (r0.get("config") or {}).get("start_grace", "")
                       if config == "optireduce" else "",
        "resync_every": args.resync_every if config == "optireduce" else "",
        "steps": r0["steps"], "train_s": round(r0["train_s"], 3),
        "target": args.target,
        "time_to_target_s": round(hit["wall_s"], 3) if hit else "",
        "step_to_target": hit["step"] if hit else "",
        "final_metric": round(finals[0], 5),
        "final_metric_se": round(r0["final_metric_se"], 5),
        "final_metric_worst": round(worst(args, finals), 5),
        "final_metric_min": round(min(finals), 5), "final_metric_max": round(max(finals), 5),
        "divergence": "%.3e" % div,
        "checked_steps": r0.get("checked_steps", ""),
        "mismatched_steps": r0.get("mismatched_steps", ""),
        "first_mismatch_step": r0.get("first_mismatch_step") or "",
        "sync_p50_ms": round(percentile(sync, 50), 2), "sync_p99_ms": round(percentile(sync, 99), 2),
        "step_p50_ms": round(percentile(r0["step_ms"], 50), 2),
        "corpus_sha256": r0.get("corpus_sha256", ""),
    }
    summary["sync_p99_over_p50"] = round(summary["sync_p99_ms"] / summary["sync_p50_ms"], 2)
    stats = r0.get("stats")
    if stats:
        summary["optireduce_calls"] = stats["interposer"].get("optireduce_calls", 0)
        summary["tar_calls"] = stats["interposer"].get("tar_calls", 0)
        device = stats.get("transport") or {}
        if device.get("devices"):  # our UDP/DPDK transport carried the job
            summary["transport_retransmits"] = device.get("retransmits", 0)
        cum = (stats.get("optireduce") or {}).get("cumulative") or {}
        if cum.get("bytes_expected"):
            summary["received_fraction"] = round(cum["bytes_received"] / cum["bytes_expected"], 5)
        for k in BOUNDED_COUNTERS:
            if k in cum:
                summary[k] = cum[k]
    return curve, summary


# OptiReduce mode's cumulative counters on rank 0 (algorithms/op_stats.h), copied as is.
BOUNDED_COUNTERS = ["calibration_ops", "bounded_ops", "early_timeout_phases", "deadline_phases",
                    "repaired_ops", "damaged_ops", "stragglers_given_up"]
RUN_FIELDS = ["status", "error", "workload", "metric", "config", "env", "seed", "ranks",
              "straggler", "loss",
              "bg_jobs", "steps", "train_s", "target", "time_to_target_s", "step_to_target",
              "final_metric", "final_metric_se", "final_metric_worst", "final_metric_min",
              "final_metric_max", "divergence", "checked_steps", "mismatched_steps",
              "first_mismatch_step", "sync_p50_ms", "sync_p99_ms", "sync_p99_over_p50",
              "step_p50_ms", "tar_calls", "optireduce_calls", "received_fraction",
              "repair_budget", "start_grace", "resync_every", "transport_retransmits",
              "corpus_sha256"] + BOUNDED_COUNTERS
SUMMARY_FIELDS = ["workload", "metric", "config", "env", "ranks", "straggler", "loss", "bg_jobs",
                  "seeds", "failed", "final_mean", "final_sd", "final_se", "final_worst_replica",
                  "divergence_max", "checked_steps", "mismatched_steps", "target", "reached",
                  "time_to_target_s", "time_to_target_sd", "speedup_vs_ring", "train_s",
                  "step_p50_ms", "sync_p50_ms", "sync_p99_ms", "sync_p99_over_p50",
                  "tar_calls", "optireduce_calls", "received_fraction", "repair_budget",
                  "start_grace", "resync_every"] + BOUNDED_COUNTERS


def mean(v):
    return sum(v) / len(v)


def sd(v):
    if len(v) < 2:
        return 0.0
    m = mean(v)
    return (sum((x - m) ** 2 for x in v) / (len(v) - 1)) ** 0.5


def aggregate(args, runs):
    """One row per (env, config), in first-seen order, over that pair's seeds."""
    keys = []
    for r in runs:
        if (r["env"], r["config"]) not in keys:
            keys.append((r["env"], r["config"]))
    rows = []
    for env, config in keys:
        every = [r for r in runs if r["env"] == env and r["config"] == config]
        rs = [r for r in every if r["status"] == "ok"]
        failed = [r for r in every if r["status"] != "ok"]
        row = {k: every[0][k] for k in ("workload", "metric", "config", "env", "ranks",
                                        "straggler", "loss", "bg_jobs", "target")}
        row.update(seeds=" ".join(str(r["seed"]) for r in every), failed=len(failed),
                   reached="0/%d" % len(every), time_to_target_s="", time_to_target_sd="")
        if not rs:
            rows.append(row)
            continue
        for k in ("repair_budget", "start_grace", "resync_every"):
            row[k] = rs[0][k]
        f = [r["final_metric"] for r in rs]
        ttt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] != ""]
        row.update(
            final_mean=round(mean(f), 5), final_sd=round(sd(f), 5),
            final_se=round(mean([r["final_metric_se"] for r in rs]), 5),
            final_worst_replica=worst(args, [r["final_metric_worst"] for r in rs]),
            divergence_max="%.3e" % max(float(r["divergence"]) for r in rs),
            reached="%d/%d" % (len(ttt), len(every)),
            time_to_target_s=round(mean(ttt), 2) if len(ttt) == len(every) else "",
            time_to_target_sd=round(sd(ttt), 2) if len(ttt) == len(every) else "",
            train_s=round(mean([r["train_s"] for r in rs]), 2),
            step_p50_ms=round(mean([r["step_p50_ms"] for r in rs]), 2),
            sync_p50_ms=round(mean([r["sync_p50_ms"] for r in rs]), 2),
            sync_p99_ms=round(mean([r["sync_p99_ms"] for r in rs]), 2))
        row["sync_p99_over_p50"] = round(row["sync_p99_ms"] / row["sync_p50_ms"], 2)
        if args.check_replicas:
            row["checked_steps"] = sum(r["checked_steps"] for r in rs)
            row["mismatched_steps"] = sum(r["mismatched_steps"] for r in rs)
        for k in ("tar_calls", "optireduce_calls") + tuple(BOUNDED_COUNTERS):
            if all(r.get(k, "") != "" for r in rs):
                row[k] = sum(r[k] for r in rs)
        if all(r.get("received_fraction", "") != "" for r in rs):
            row["received_fraction"] = round(mean([r["received_fraction"] for r in rs]), 5)
        rows.append(row)
    for row in rows:
        ring = next((x for x in rows if x["env"] == row["env"] and x["config"] == "ring"), None)
        row["speedup_vs_ring"] = ""
        if ring and ring["time_to_target_s"] != "" and row["time_to_target_s"] not in ("", 0):
            row["speedup_vs_ring"] = round(ring["time_to_target_s"] / row["time_to_target_s"], 2)
    return rows


def print_table(args, rows):
    print()
    print("%-11s %-21s %5s %16s %8s %9s %7s %11s %9s %8s %8s %8s" % (
        "env", "config", "seeds", "final mean+-sd", "worst", "diverge", "reached",
        "to %g" % args.target, "speed-up", "train s", "sync p50", "sync p99"))
    for s in rows:
        if "final_mean" not in s:
            print("%-11s %-21s %5d  every job failed" % (s["env"], CONFIGS[s["config"]],
                                                        len(s["seeds"].split())))
            continue
        ttt = "%.1f s" % s["time_to_target_s"] if s["time_to_target_s"] != "" else "-"
        print("%-11s %-21s %5d %16s %8.3f %9s %7s %11s %9s %8.1f %8.1f %8.1f" % (
            s["env"], CONFIGS[s["config"]], len(s["seeds"].split()),
            "%.3f +- %.3f" % (s["final_mean"], s["final_sd"]), s["final_worst_replica"],
            s["divergence_max"], s["reached"], ttt,
            "%.2fx" % s["speedup_vs_ring"] if s["speedup_vs_ring"] != "" else "-",
            s["train_s"], s["sync_p50_ms"], s["sync_p99_ms"]))
    if args.check_replicas:
        print("replica check: %s" % ", ".join(
            "%s/%s %d of %d steps mismatched" % (s["env"], s["config"], s["mismatched_steps"],
                                                 s["checked_steps"])
            for s in rows if "checked_steps" in s))
    for s in rows:
        if s["failed"]:
            print("%s/%s: %d of %d jobs failed (tta_runs.csv: error)" % (
                s["env"], s["config"], s["failed"], len(s["seeds"].split())))


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def add_common(ap):
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="digits",
                    help="digits (MLP, test accuracy %%; default) or charlm (char-level "
                         "transformer LM on Python's stdlib sources, validation loss in nats)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks (processes), 2..8 (default 4)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="digits: epochs per job (default 10; quick 3)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="digits: MLP width H (default 1024: 4.5 MB of gradients; quick 256)")
    ap.add_argument("--steps", type=int, default=None,
                    help="charlm: steps per job (default 300; quick 24)")
    ap.add_argument("--d-model", type=int, default=None,
                    help="charlm: transformer width (default 64; quick 32)")
    ap.add_argument("--layers", type=int, default=None, help="charlm: layers (default 2; quick 1)")
    ap.add_argument("--heads", type=int, default=None, help="charlm: attention heads (default 4)")
    ap.add_argument("--context", type=int, default=None,
                    help="charlm: characters per training window (default 64; quick 32)")
    ap.add_argument("--batch", type=int, default=None,
                    help="per-rank batch: images (digits, default 16) or windows (charlm, "
                         "default 8)")
    ap.add_argument("--bucket-mb", type=float, default=2.0, help="DDP bucket_cap_mb (default 2)")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate: SGD with momentum 0.9 (digits, default 0.05) or "
                         "Adam (charlm, default 0.003)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="evaluate every N steps (digits: twice per epoch, quick once; "
                         "charlm: 20, quick 8)")
    ap.add_argument("--straggler-rank", type=int, default=None,
                    help="rank that sleeps the straggler delay (default: the last)")
    ap.add_argument("--seed", type=int, default=1, help="the seed of a single-seed run")
    ap.add_argument("--seeds", default=None, metavar="S1,S2,...",
                    help="run every env and config once per seed (model init, data order, "
                         "straggler schedule, injected loss; default: --seed)")
    ap.add_argument("--check-replicas", action="store_true",
                    help="every step, compare a hash of every rank's parameters (Gloo "
                         "allgather) and count the steps where they differ")
    ap.add_argument("--repair-budget", type=float, default=None,
                    help="optireduce config: OPTIREDUCE_REPAIR_BUDGET (fraction of the bound "
                         "for repairs and for waiting on a rank that has not started; "
                         "default: the library's, 1)")
    ap.add_argument("--start-grace", choices=["budget", "learned"], default=None,
                    help="optireduce config: OPTIREDUCE_START_GRACE (how long a rank that "
                         "has not started is waited for; default: the library's, learned)")
    ap.add_argument("--resync-every", type=int, default=0, metavar="N",
                    help="optireduce config: optireduce.sync_parameters(model) every N steps "
                         "(default 0 = never)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per job before it is killed (digits: 300, quick 60; "
                         "charlm: 900, quick 120)")
    ap.add_argument("--torch-lib", default=None, help="liboptireduce_torch.so "
                    "(default $OPTIREDUCE_TORCH_LIB or build/gloo_ext/)")
    ap.add_argument("--bench-bin", default=os.path.join(REPO, "build", "bench", "optireduce-bench"),
                    help="optireduce-bench, for background jobs (+bgK; default build/bench/)")
    ap.add_argument("--lab", action="store_true",
                    help="run the ranks in the cloud lab (bench/lab: a network namespace per "
                         "rank on a bridge; root); an env's LOSS becomes real packet loss on "
                         "every rank's link, for every config")
    ap.add_argument("--quick", action="store_true",
                    help="small model, few steps, one env (tail:exp:10@0.01): for tests")


def finish_common(ap, args):
    if not 2 <= args.ranks <= 8:
        ap.error("--ranks takes a number from 2 to 8, got %d" % args.ranks)
    defaults = dict(DEFAULTS[args.workload])
    if args.quick:
        defaults.update(QUICK[args.workload])
    other = "charlm" if args.workload == "digits" else "digits"
    own = {"digits": ("epochs", "hidden"),
           "charlm": ("steps", "d_model", "layers", "heads", "context")}
    for name in own[other]:
        if getattr(args, name) is not None:
            ap.error("--%s applies to --workload %s only" % (name.replace("_", "-"), other))
    for name in own[args.workload] + ("batch", "lr", "timeout"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    args.metric = "accuracy %" if args.workload == "digits" else "val loss"
    for flag in own[args.workload] + ("batch",):
        if getattr(args, flag) < 1:
            ap.error("--%s must be at least 1, got %d" % (flag.replace("_", "-"), getattr(args, flag)))
    if args.workload == "charlm" and args.d_model % args.heads:
        ap.error("--d-model %d is not a multiple of --heads %d" % (args.d_model, args.heads))
    if args.bucket_mb <= 0:
        ap.error("--bucket-mb must be positive, got %g" % args.bucket_mb)
    if args.lr <= 0:
        ap.error("--lr must be positive, got %g" % args.lr)
    if args.repair_budget is not None and not 0 <= args.repair_budget <= 10:
        ap.error("--repair-budget must be a fraction of the bound in [0, 10], got %g"
                 % args.repair_budget)
    if args.timeout <= 0:
        ap.error("--timeout must be positive, got %g" % args.timeout)
    if args.resync_every < 0:
        ap.error("--resync-every must be 0 (never) or a number of steps, got %d"
                 % args.resync_every)
    if args.seeds is None:
        args.seeds = [args.seed]
    else:
        try:
            args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            ap.error("--seeds: '%s' is not a comma-separated list of integers" % args.seeds)
        if not args.seeds or len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
            ap.error("--seeds: '%s' needs distinct non-negative integers" % ",".join(
                str(s) for s in args.seeds))
    if args.workload == "digits":
        steps_per_epoch = (1437 // args.ranks) // args.batch
        if steps_per_epoch < 1:
            ap.error("--batch %d leaves no step per epoch with %d ranks" % (args.batch, args.ranks))
        if args.eval_every is None:
            args.eval_every = steps_per_epoch if args.quick else max(1, steps_per_epoch // 2)
    elif args.eval_every is None:
        args.eval_every = defaults["eval_every"]
    if args.eval_every < 1:
        ap.error("--eval-every must be at least 1, got %d" % args.eval_every)
    if args.lab and os.geteuid() != 0:
        ap.error("--lab needs root (network namespaces, veth, tc)")
    if args.straggler_rank is None:
        args.straggler_rank = args.ranks - 1
    if not 0 <= args.straggler_rank < args.ranks:
        ap.error("--straggler-rank must be in 0..%d, got %d" % (args.ranks - 1, args.straggler_rank))
    if args.workload == "charlm":
        sys.path.insert(0, HERE)
        import charlm

        try:
            charlm.check_corpus()
            digest = charlm.read_corpus()[2]
        except charlm.DataError as e:
            raise UsageError(str(e)) from None
        if digest != charlm.DEBIAN12_SHA256:
            print("tta.py: note: the char LM's text (%s, SHA-256 %s) differs from Debian 12's "
                  "python3.11 (%s): its losses are not comparable with runs on Debian 12"
                  % (charlm.STDLIB_DIR, digest[:16], charlm.DEBIAN12_SHA256[:16]), flush=True)


def describe(args):
    if args.workload == "digits":
        return "MLP 64-%d-%d-10 on digits, %d epochs, batch %d/rank, SGD lr %g" % (
            args.hidden, args.hidden, args.epochs, args.batch, args.lr)
    return ("char LM: %d-layer transformer, d_model %d, %d heads, context %d, %d steps, "
            "batch %d/rank, Adam lr %g" % (args.layers, args.d_model, args.heads, args.context,
                                          args.steps, args.batch, args.lr))


def cmd_run(args):
    lib = torch_lib(args) if set(args.configs) - {"ring"} else None
    envs = [parse_env(e) for e in args.env]
    if any(bg for _, _, _, bg in envs) and not os.access(args.bench_bin, os.X_OK):
        raise UsageError("--bench-bin: %s is not an executable (background jobs +bgK run "
                         "optireduce-bench; ./scripts/build.sh builds it)" % args.bench_bin)
    os.makedirs(args.out, exist_ok=True)
    curve_rows, runs = [], []
    print("time to accuracy: %d ranks (%s), %s, seeds %s, target %s %g" % (
        args.ranks, "lab namespaces on a bridge" if args.lab else "local processes, loopback",
        describe(args), ",".join(str(s) for s in args.seeds), args.metric, args.target),
        flush=True)
    for env in envs:
        name, dist_spec, loss, bg = env
        print("env %s: straggler rank %d sleeps %s ms per step%s%s" % (
            name, args.straggler_rank, dist_spec,
            "" if not loss else ", %g%% packet loss on every link" % (loss * 100) if args.lab else
            ", UDP configs drop %g%% of datagrams" % (loss * 100),
            ", %d background allreduce job%s" % (bg, "s" if bg > 1 else "") if bg else ""),
            flush=True)
        # Seeds outside, configs inside: the configs of one seed run back to back, so a
        # change in the machine's load between seeds hits every config alike.
        for seed in args.seeds:
            for config in args.configs:
                try:
                    curve, run = run_one(args, env, seed, config, lib)
                except JobError as e:
                    # A job that fails is a result (e.g. a rank declared dead): record it,
                    # go on with the others, exit with FAILED_JOBS at the end.
                    print("tta.py: %s" % e, file=sys.stderr, flush=True)
                    runs.append(failed_run(args, env, seed, config, e))
                    print("  %-10s %-10s seed %d FAILED: %s" % (name, config, seed,
                                                               runs[-1]["error"]), flush=True)
                    write_all(args, curve_rows, runs)
                    continue
                curve_rows += curve
                runs.append(run)
                ttt = run["time_to_target_s"]
                print("  %-10s %-10s seed %d done: %s, final %.3f (worst replica %.3f), "
                      "divergence %s%s, sync p50 %.1f ms p99 %.1f ms"
                      % (name, config, seed, "target at %.1f s" % ttt if ttt != "" else
                         "target never reached", run["final_metric"], run["final_metric_worst"],
                         run["divergence"],
                         ", %s of %s steps mismatched" % (run["mismatched_steps"],
                                                          run["checked_steps"])
                         if args.check_replicas else "",
                         run["sync_p50_ms"], run["sync_p99_ms"]), flush=True)
                # Write as we go: a long run that dies later keeps what it measured.
                write_all(args, curve_rows, runs)
    write_all(args, curve_rows, runs)
    summary = aggregate(args, runs)
    print_table(args, summary)
    import plot

    png = plot.plot_tta(curve_rows, summary, os.path.join(args.out, "tta.png"), args.target)
    print("\nwrote %s" % ", ".join(os.path.join(args.out, n) for n in (
        "tta_curve.csv", "tta_runs.csv", "tta_summary.csv", os.path.basename(png))))
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        print("tta.py: %d of %d jobs failed: %s" % (len(failed), len(runs), "; ".join(
            "%s/%s seed %d: %s" % (r["env"], r["config"], r["seed"], r["error"])
            for r in failed)), file=sys.stderr)
        return FAILED_JOBS
    return 0


def write_all(args, curve_rows, runs):
    write_csv(os.path.join(args.out, "tta_curve.csv"), curve_rows,
              ["workload", "config", "env", "seed", "wall_s", "step", "metric"])
    write_csv(os.path.join(args.out, "tta_runs.csv"), runs, RUN_FIELDS)
    write_csv(os.path.join(args.out, "tta_summary.csv"), aggregate(args, runs), SUMMARY_FIELDS)


def failed_run(args, env, seed, config, err):
    """The tta_runs.csv row of a job that failed: what ran, and the first error a rank
    printed (a Python exception's last line), or the job error's first line."""
    env_name, dist_spec, loss, bg = env
    text = str(err)
    errors = [l.strip() for l in text.splitlines() if re.match(r"^\w*(Error|Exception): ", l.strip())]
    return {"workload": args.workload, "config": config, "env": env_name, "seed": seed,
            "ranks": args.ranks, "straggler": dist_spec, "bg_jobs": bg, "target": args.target,
            "loss": loss if (config in OUR_UDP or args.lab) else 0.0,
            "metric": "accuracy_pct" if args.workload == "digits" else "val_loss",
            "status": "failed", "error": (errors[0] if errors else text.splitlines()[0])[:400]}


def cmd_calibrate(args):
    lib = None  # Gloo ring only: optireduce is not loaded
    args.target = 100.0 if args.workload == "digits" else 0.0  # unused: step times only
    args.check_replicas = False
    specs = [d.strip() for d in args.dists.split(",") if d.strip()]
    parsed = []
    for d in specs:
        dist, _, loss_s = d.partition("@")
        try:
            dists.parse(dist, what="--dists")
            loss = float(loss_s) if loss_s else 0.0
        except ValueError as e:
            raise UsageError(str(e) if not loss_s or "--dists" in str(e) else
                             "--dists: '%s' has loss '%s'; allowed: a number in [0, 1)"
                             % (d, loss_s)) from None
        if not 0 <= loss < 1:
            raise UsageError("--dists: '%s' has loss '%s'; allowed: a number in [0, 1)" % (d, loss_s))
        if loss and not args.lab:
            raise UsageError("--dists: '%s': packet loss for Gloo's ring needs --lab (real "
                             "loss on the links; TCP on loopback cannot lose)" % d)
        parsed.append((dist, loss))
    print("calibration: Gloo ring, %d ranks, per-step sync time of rank 0 (straggler rank %d)"
          % (args.ranks, args.straggler_rank))
    print("%-16s %9s %9s %8s" % ("straggler", "p50 ms", "p99 ms", "p99/p50"))
    for d, (dist, loss) in zip(specs, parsed):
        _, s = run_one(args, ("cal", dist, loss, 0), args.seeds[0], "ring", lib, progress=False)
        print("%-16s %9.1f %9.1f %8.2f" % (d, s["sync_p50_ms"], s["sync_p99_ms"],
                                           s["sync_p99_over_p50"]), flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="the time-to-accuracy comparison (default)")
    add_common(run)
    run.add_argument("--env", action="append", default=None, metavar="NAME:DIST[@LOSS][+bgK]",
                     help="an environment (repeatable; default %s, with --lab also %s)"
                          % (" ".join(DEFAULT_ENVS), " ".join(LAB_ENVS)))
    run.add_argument("--configs", default="ring,tar_udp,optireduce",
                     help="comma-separated subset of ring,tar,tar_udp,optireduce "
                          "(default ring,tar_udp,optireduce)")
    run.add_argument("--target", type=float, default=None,
                     help="target metric: digits test accuracy in %% (default 95; quick 85), "
                          "charlm validation loss in nats (default 2.25; quick 3.0)")
    run.add_argument("--out", default="tta-results", help="output directory (CSV, PNG)")
    cal = sub.add_parser("calibrate", help="Gloo ring's per-step p99/p50 for straggler delays")
    add_common(cal)
    cal.add_argument("--dists", default="none,exp:8,exp:20,exp:45,exp:80",
                     help="comma-separated straggler distributions to try, each DIST[@LOSS] "
                          "(LOSS: packet loss on every link, with --lab)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "calibrate", "-h", "--help"):
        argv = ["run"] + argv
    args = ap.parse_args(argv)
    p = run if args.cmd == "run" else cal
    cloudlab.install_signal_handlers()  # Ctrl-C/SIGTERM unwind: every job and lab is torn down
    try:
        finish_common(p, args)
        if args.cmd == "run":
            if args.env is None:
                args.env = QUICK_ENVS if args.quick else \
                    DEFAULT_ENVS + (LAB_ENVS if args.lab else [])
            configs = [c.strip() for c in args.configs.split(",") if c.strip()]
            bad = [c for c in configs if c not in CONFIGS]
            if bad or not configs:
                p.error("--configs: '%s' is not one of %s" % (",".join(bad or [args.configs]),
                                                              ", ".join(CONFIGS)))
            args.configs = configs
            if args.target is None:
                args.target = DEFAULTS[args.workload]["target"] if not args.quick else \
                    QUICK[args.workload]["target"]
            if args.workload == "digits" and not 0 < args.target <= 100:
                p.error("--target must be in (0, 100] (test accuracy %%), got %g" % args.target)
            if args.workload == "charlm" and not args.target > 0:
                p.error("--target must be a positive validation loss (nats), got %g" % args.target)
            for e in args.env:
                try:
                    _, _, _, bg = parse_env(e)
                except UsageError as err:
                    p.error(str(err))
                if bg and not args.lab:
                    p.error("--env %s: background jobs (+bg%d) run in the lab: add --lab"
                            % (e, bg))
            return cmd_run(args)
        return cmd_calibrate(args)
    except UsageError as e:
        print("tta.py: error: %s" % e, file=sys.stderr)
        return 2
    except JobError as e:
        print("tta.py: error: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tta.py: interrupted; every job was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
