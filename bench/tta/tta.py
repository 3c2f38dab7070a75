#!/usr/bin/python3
"""Time-to-accuracy of DDP training: stock Gloo ring vs TAR vs OptiReduce mode, under tails.

Each (environment, configuration) pair is a fresh 4-rank torch.distributed job (local
processes on 127.0.0.1, or with --lab one per network namespace of bench/lab; file://
rendezvous) training the same MLP on sklearn's digits (tta_worker.py). Configurations:

  ring        stock Gloo ring allreduce over Gloo's TCP (optireduce not loaded)
  tar         GLOO_ALGO=transpose: TAR (reliable, exact) over Gloo's TCP, optireduce loaded
  tar_udp     GLOO_ALGO=transpose over GLOO_DEVICE_TRANSPORT=UDP: TAR over our UDP transport,
              which retransmits what is lost (an environment's injected loss applies)
  optireduce  GLOO_ALGO=optireduce over GLOO_DEVICE_TRANSPORT=UDP (bounded OptiReduce mode);
              an environment's injected loss (OPTIREDUCE_FAULTS drop=P) applies here and to
              tar_udp only (Gloo's TCP cannot lose packets on loopback)

Environments (--env NAME:DIST[@LOSS], repeatable): rank `--straggler-rank` sleeps a delay
drawn from DIST (none, const:X, exp:MEAN, uniform:A:B, normal:MEAN:STD, pareto:SCALE:SHAPE,
ms) before each step; LOSS is the injected receive loss of our UDP transport (with
--lab: real packet loss on every rank's link, for every config).

Output: a progress line per evaluation, a table (time to --target accuracy, final accuracy,
per-step sync time p50/p99 of rank 0), and in --out: tta_curve.csv (config, env, wall_s,
step, accuracy), tta_summary.csv, tta.png (accuracy vs wall-clock, one panel per env).

  tta.py                                  # the default run (~10 min on 2 busy cores)
  tta.py --quick --out /tmp/tta           # a small run (tests)
  tta.py calibrate --dists none,exp:15,exp:60 --epochs 4   # Gloo ring p99/p50 per DIST
  tta.py --lab                            # ranks in bench/lab namespaces (root)
"""

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import queue
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
# Calibrated on this 2-core machine (README "Time to accuracy"): Gloo ring's per-step sync
# time p99/p50 is ~1.5 under 'moderate' and ~3 under 'tail3'.
DEFAULT_ENVS = ["moderate:exp:5", "tail3:exp:30@0.01"]


class UsageError(Exception):
    pass


class JobError(Exception):
    """A training job failed or timed out (message has the ranks' exit codes and logs)."""


def parse_env(spec):
    """NAME:DIST[@LOSS] -> (name, dist, loss)."""
    what = "--env"
    if ":" not in spec:
        raise UsageError("%s: '%s' is not NAME:DIST[@LOSS] (e.g. tail3:exp:45@0.01)" % (what, spec))
    name, rest = spec.split(":", 1)
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
    return name, rest, loss


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


def run_one(args, env_name, dist_spec, loss, config, lib, progress=True):
    """One training job; returns a dict (curve rows, summary numbers)."""
    settings = {
        "import_optireduce": config != "ring", "epochs": args.epochs, "batch": args.batch,
        "hidden": args.hidden, "bucket_mb": args.bucket_mb, "lr": args.lr,
        "eval_every": args.eval_every, "straggler": dist_spec,
        "straggler_rank": args.straggler_rank, "seed": args.seed,
        "op_timeout_s": args.timeout,
        "resync_every": args.resync_every if config == "optireduce" else 0,
    }
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
            env = rank_env(config, 0.0, lib, args.seed, args.repair_budget, args.start_grace)
        else:
            env = rank_env(config, loss, lib, args.seed, args.repair_budget, args.start_grace)
        job = Job(args.ranks, env, settings, workdir, lab)
        deadline = time.monotonic() + args.timeout
        curve = []
        label = "%-10s %-11s" % (env_name, config)
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
                step, epoch, wall, acc = int(parts[1]), int(parts[2]), float(parts[3]), float(parts[4])
                curve.append({"config": config, "env": env_name, "wall_s": wall, "step": step,
                              "accuracy": acc})
                if progress:
                    print("  %s epoch %2d step %4d  t=%6.1fs  acc %5.1f%%"
                          % (label, epoch, step, wall, acc), flush=True)
        codes = []
        for p in job.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                job.kill()
                codes.append("timeout")
        if codes != [0] * args.ranks:
            raise JobError("env %s, config %s: ranks exited %s (a rank still running after "
                           "--timeout %g s is killed)\n%s"
                           % (env_name, config, codes, args.timeout, job.tail_logs()))
        results = []
        for path in job.outs:
            with open(path) as f:
                results.append(json.load(f))
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
    reached = next((c["wall_s"] for c in curve if c["accuracy"] >= args.target), None)
    reached_step = next((c["step"] for c in curve if c["accuracy"] >= args.target), None)
    finals = [r["final_accuracy"] for r in results]
    summary = {
        "config": config, "env": env_name, "straggler": dist_spec,
        "loss": loss if (config in OUR_UDP or args.lab) else 0.0,
        # As the library parsed it (OPTIREDUCE_REPAIR_BUDGET), not as this script meant it.
        "repair_budget": (r0.get("config") or {}).get("repair_budget", "")
                         if config == "optireduce" else "",
        "start_grace": (r0.get("config") or {}).get("start_grace", "")
                       if config == "optireduce" else "",
        "resync_every": args.resync_every if config == "optireduce" else "",
        "steps": r0["steps"], "train_s": round(r0["train_s"], 3),
        "target": args.target,
        "time_to_target_s": round(reached, 3) if reached is not None else "",
        "step_to_target": reached_step if reached_step is not None else "",
        "final_accuracy": round(finals[0], 3),
        "final_accuracy_min": round(min(finals), 3), "final_accuracy_max": round(max(finals), 3),
        "sync_p50_ms": round(percentile(sync, 50), 2), "sync_p99_ms": round(percentile(sync, 99), 2),
        "step_p50_ms": round(percentile(r0["step_ms"], 50), 2),
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


SUMMARY_FIELDS = ["config", "env", "straggler", "loss", "steps", "train_s", "target",
                  "time_to_target_s", "step_to_target", "final_accuracy", "final_accuracy_min",
                  "final_accuracy_max", "sync_p50_ms", "sync_p99_ms", "sync_p99_over_p50",
                  "step_p50_ms", "tar_calls", "optireduce_calls", "received_fraction",
                  "repair_budget", "start_grace", "resync_every", "transport_retransmits"]
# OptiReduce mode's cumulative counters on rank 0 (algorithms/op_stats.h), copied as is.
BOUNDED_COUNTERS = ["calibration_ops", "bounded_ops", "early_timeout_phases", "deadline_phases",
                    "repaired_ops", "damaged_ops", "stragglers_given_up"]
SUMMARY_FIELDS += BOUNDED_COUNTERS


def print_table(summaries, target):
    print()
    print("%-10s %-22s %9s %6s %10s %9s %9s %8s %8s %7s" % (
        "env", "config", "to %g%%" % target, "steps", "train s", "final %", "min-max",
        "sync p50", "sync p99", "p99/p50"))
    for s in summaries:
        ttt = "%.1f s" % s["time_to_target_s"] if s["time_to_target_s"] != "" else "never"
        print("%-10s %-22s %9s %6d %10.1f %9.1f %9s %8.1f %8.1f %7.2f" % (
            s["env"], CONFIGS[s["config"]], ttt, s["steps"], s["train_s"], s["final_accuracy"],
            "%.0f-%.0f" % (s["final_accuracy_min"], s["final_accuracy_max"]),
            s["sync_p50_ms"], s["sync_p99_ms"], s["sync_p99_over_p50"]))


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def add_common(ap):
    ap.add_argument("--ranks", type=int, default=4, help="ranks (processes), 2..8 (default 4)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per job (default 10; quick 3)")
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch (default 16)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="MLP width H (default 1024: 4.5 MB of gradients; quick 256)")
    ap.add_argument("--bucket-mb", type=float, default=2.0, help="DDP bucket_cap_mb (default 2)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="evaluate every N steps (default: twice per epoch; quick once)")
    ap.add_argument("--straggler-rank", type=int, default=None,
                    help="rank that sleeps the straggler delay (default: the last)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repair-budget", type=float, default=None,
                    help="optireduce config: OPTIREDUCE_REPAIR_BUDGET (fraction of the bound "
                         "for repairs and for waiting on a rank that has not started; "
                         "default: the library's, 1)")
    ap.add_argument("--start-grace", choices=["budget", "learned"], default=None,
                    help="optireduce config: OPTIREDUCE_START_GRACE (how long a rank that "
                         "has not started is waited for; default: the library's, budget)")
    ap.add_argument("--resync-every", type=int, default=0, metavar="N",
                    help="optireduce config: optireduce.sync_parameters(model) every N steps "
                         "(replicas drift after damaged operations; default 0 = never)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per job before it is killed (default 300; quick 60)")
    ap.add_argument("--torch-lib", default=None, help="liboptireduce_torch.so "
                    "(default $OPTIREDUCE_TORCH_LIB or build/gloo_ext/)")
    ap.add_argument("--lab", action="store_true",
                    help="run the ranks in the cloud lab (bench/lab: a network namespace per "
                         "rank on a bridge; root); an env's LOSS becomes real packet loss on "
                         "every rank's link, for every config")
    ap.add_argument("--quick", action="store_true",
                    help="small model, 3 epochs, one env (tail:exp:10@0.01): for tests (~1 min)")


def finish_common(ap, args):
    if not 2 <= args.ranks <= 8:
        ap.error("--ranks takes a number from 2 to 8, got %d" % args.ranks)
    if args.epochs is None:
        args.epochs = 3 if args.quick else 10
    if args.hidden is None:
        args.hidden = 256 if args.quick else 1024
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 300.0
    for flag, v, lo in (("--epochs", args.epochs, 1), ("--batch", args.batch, 1),
                        ("--hidden", args.hidden, 1)):
        if v < lo:
            ap.error("%s must be at least %d, got %d" % (flag, lo, v))
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
    steps_per_epoch = (1437 // args.ranks) // args.batch
    if steps_per_epoch < 1:
        ap.error("--batch %d leaves no step per epoch with %d ranks" % (args.batch, args.ranks))
    if args.eval_every is None:
        args.eval_every = steps_per_epoch if args.quick else max(1, steps_per_epoch // 2)
    if args.eval_every < 1:
        ap.error("--eval-every must be at least 1, got %d" % args.eval_every)
    if args.lab and os.geteuid() != 0:
        ap.error("--lab needs root (network namespaces, veth, tc)")
    if args.straggler_rank is None:
        args.straggler_rank = args.ranks - 1
    if not 0 <= args.straggler_rank < args.ranks:
        ap.error("--straggler-rank must be in 0..%d, got %d" % (args.ranks - 1, args.straggler_rank))


def cmd_run(args):
    lib = torch_lib(args) if set(args.configs) - {"ring"} else None
    envs = [parse_env(e) for e in args.env]
    os.makedirs(args.out, exist_ok=True)
    curve_rows, summaries = [], []
    print("time to accuracy: %d ranks (%s), MLP 64-%d-%d-10 on digits, %d epochs, "
          "batch %d/rank, target %g%%" % (
              args.ranks, "lab namespaces on a bridge" if args.lab else "local processes, loopback",
              args.hidden, args.hidden, args.epochs, args.batch, args.target), flush=True)
    for name, dist_spec, loss in envs:
        print("env %s: straggler rank %d sleeps %s ms per step%s" % (
            name, args.straggler_rank, dist_spec,
            "" if not loss else ", %g%% packet loss on every link" % (loss * 100) if args.lab else
            ", optireduce config drops %g%% of datagrams" % (loss * 100)), flush=True)
        for config in args.configs:
            curve, summary = run_one(args, name, dist_spec, loss, config, lib)
            curve_rows += curve
            summaries.append(summary)
            ttt = summary["time_to_target_s"]
            print("  %-10s %-11s done: %s, final %.1f%%, sync p50 %.1f ms p99 %.1f ms (p99/p50 %.2f)"
                  % (name, config, "%g%% at %.1f s" % (args.target, ttt) if ttt != "" else
                     "never reached %g%%" % args.target, summary["final_accuracy"],
                     summary["sync_p50_ms"], summary["sync_p99_ms"], summary["sync_p99_over_p50"]),
                  flush=True)
            # Write as we go: a long run that dies later keeps what it measured.
            write_csv(os.path.join(args.out, "tta_curve.csv"), curve_rows,
                      ["config", "env", "wall_s", "step", "accuracy"])
            write_csv(os.path.join(args.out, "tta_summary.csv"), summaries, SUMMARY_FIELDS)
    print_table(summaries, args.target)
    sys.path.insert(0, HERE)
    import plot

    png = plot.plot_tta(curve_rows, summaries, os.path.join(args.out, "tta.png"), args.target)
    print("\nwrote %s, %s, %s" % (os.path.join(args.out, "tta_curve.csv"),
                                  os.path.join(args.out, "tta_summary.csv"), png))
    return 0


def cmd_calibrate(args):
    lib = None  # Gloo ring only: optireduce is not loaded
    args.target = 100.0  # unused: calibration looks at step times only
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
        _, s = run_one(args, "cal", dist, loss, "ring", lib, progress=False)
        print("%-16s %9.1f %9.1f %8.2f" % (d, s["sync_p50_ms"], s["sync_p99_ms"],
                                           s["sync_p99_over_p50"]), flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="the time-to-accuracy comparison (default)")
    add_common(run)
    run.add_argument("--env", action="append", default=None, metavar="NAME:DIST[@LOSS]",
                     help="an environment (repeatable; default %s)" % " ".join(DEFAULT_ENVS))
    run.add_argument("--configs", default="ring,tar,optireduce",
                     help="comma-separated subset of ring,tar,tar_udp,optireduce")
    run.add_argument("--target", type=float, default=None,
                     help="target test accuracy in %% (default 95; quick 85)")
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
    finish_common(p, args)
    cloudlab.install_signal_handlers()  # Ctrl-C/SIGTERM unwind: every job and lab is torn down
    try:
        if args.cmd == "run":
            if args.env is None:
                args.env = ["tail:exp:10@0.01"] if args.quick else DEFAULT_ENVS
            configs = [c.strip() for c in args.configs.split(",") if c.strip()]
            bad = [c for c in configs if c not in CONFIGS]
            if bad or not configs:
                p.error("--configs: '%s' is not one of %s" % (",".join(bad or [args.configs]),
                                                              ", ".join(CONFIGS)))
            args.configs = configs
            if args.target is None:
                args.target = 85.0 if args.quick else 95.0
            if not 0 < args.target <= 100:
                p.error("--target must be in (0, 100], got %g" % args.target)
            for e in args.env:
                try:
                    parse_env(e)
                except UsageError as err:
                    p.error(str(err))
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
