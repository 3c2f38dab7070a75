#!/usr/bin/python3
"""Incast at the owner: N-1 senders into one receiver at once. Runs TAR, exact
(`transpose`) and in OptiReduce mode (`optireduce`), flat and 2D when optireduce-bench has
--layout, over our UDP in the cloud lab, with the receiver's port open and constrained (a
tbf rate with a small queue on the bridge port towards rank 0, whose shard every other
rank sends at once), and reports rank 0's drops and the p50/p99 of one allreduce. Needs
root; every namespace, link and process it makes is removed on success, failure,
SIGINT/SIGTERM and exit (cloudlab.Lab).

  incast.py [--ranks 8,16] [--sizes 1M,16M] [--iterations 30] [--warmup 5]
            [--rate 2gbit] [--queue 1mb] [--layouts flat,2d]
            [--algos transpose,optireduce] [--bench-bin PATH] [--csv incast.csv]
            [--timeout 300]

`optireduce` runs warm up OPTIREDUCE_CALIBRATION_OPS more iterations first: the library's
calibrating operations (exact TAR), so that every timed one is bounded.

Per row: algorithm, layout, ranks, size, link (`open`, or `RATE/QUEUE` on rank 0's port), p50 and
p99 ms (rank 0, --samples-csv), the kernel's UDP RcvbufErrors and InErrors in rank 0's
namespace and over all ranks, the packets the tbf queue on rank 0's port dropped, rank 0's
eth0 rx drops, and the packets every rank's engine resent (--counters-csv). A layout the
binary cannot run has status `not built`.
"""

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import cloudlab  # noqa: E402
import lab as labtool  # noqa: E402  (run_ranks, read_counters)
import scaling_model  # noqa: E402  (group_size, layout_flags, parse_size)

DEFAULT_BIN = os.path.join(os.environ.get("OPTIREDUCE_BUILD_DIR", os.path.join(REPO, "build")),
                           "bench", "optireduce-bench")
# The operations OptiReduce mode calibrates before it runs bounded (TimeoutOptions).
OPTIREDUCE_CALIBRATION_OPS = 20
ALGOS = ("transpose", "optireduce")
FIELDS = ["algo", "layout", "ranks", "bytes", "link", "status", "group", "iterations", "p50_ms",
          "p99_ms", "owner_rcvbuf_errors", "owner_udp_in_errors", "all_rcvbuf_errors",
          "owner_queue_drops", "owner_if_rx_drops", "resent_pkts"]


def udp_counters(ns):
    """{name: value} of the Udp group of /proc/net/snmp in namespace ns."""
    out = cloudlab.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]).stdout
    lines = [l.split() for l in out.splitlines() if l.startswith("Udp:")]
    if len(lines) < 2 or len(lines[0]) != len(lines[1]):
        raise RuntimeError("no Udp counters in /proc/net/snmp of %s" % ns)
    return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:])}


def qdisc_drops(ns, dev):
    out = cloudlab.run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev",
                        dev]).stdout
    return sum(int(q.get("drops", 0)) for q in json.loads(out or "[]")
               if q.get("kind") == "tbf")


def rx_drops(ns, dev):
    out = cloudlab.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev]).stdout
    stats = json.loads(out)[0].get("stats64", {})
    return int(stats.get("rx", {}).get("dropped", 0))


def snapshot(lab):
    udp = [udp_counters(ns) for ns in lab.ns]
    return dict(owner_rcvbuf=udp[0].get("RcvbufErrors", 0),
                owner_in_errors=udp[0].get("InErrors", 0),
                all_rcvbuf=sum(u.get("RcvbufErrors", 0) for u in udp),
                queue=qdisc_drops(lab.bridge_ns, "p0"),
                rx=rx_drops(lab.ns[0], "eth0"))


def constrain(lab, rate, queue):
    """tbf on the bridge port towards rank 0: RATE, a queue of QUEUE bytes."""
    lab.tc_in(lab.bridge_ns, ["qdisc", "replace", "dev", "p0", "root", "tbf", "rate", rate,
                              "burst", "64kb", "limit", queue])


def open_link(lab):
    cloudlab.run(["ip", "netns", "exec", lab.bridge_ns, "tc", "qdisc", "del", "dev", "p0",
                  "root"], check=False)


def one_run(a, lab, algo, layout, nbytes, link, help_text, tag):
    n = lab.ranks
    shared = os.path.join(lab.tmp, "rdv-%s" % tag)
    os.makedirs(shared)
    samples = os.path.join(lab.tmp, "samples-%s.csv" % tag)
    counters = os.path.join(lab.tmp, "counters-%s.csv" % tag)
    extra = scaling_model.layout_flags(layout, n, help_text)
    warmup = a.warmup + (OPTIREDUCE_CALIBRATION_OPS if algo == "optireduce" else 0)
    cmds = [[a.bench_bin, "--size", str(n), "--rank", str(r), "--shared-path", shared,
             "--prefix", tag, "--tcp-device", "eth0", "--transport", "udp",
             "--timeout", str(a.timeout), "--elements", str(nbytes // 4),
             "--iteration-count", str(a.iterations), "--warmup-iters", str(warmup),
             "--samples-csv", samples, "--counters-csv", counters] + extra + [algo]
            for r in range(n)]
    print("incast: %s, %d ranks, %s, %s: %s" % (algo, n, layout, link, " ".join(
        shlex.quote(c) for c in cmds[0])), flush=True)
    before = snapshot(lab)
    rc, _, errs = labtool.run_ranks(lab, cmds, a.timeout)
    after = snapshot(lab)
    if rc != 0:
        labtool.report_failure(rc, errs)
        raise RuntimeError("%s %s at %d ranks, %d bytes, %s failed (rc %d)" % (
            algo, layout, n, nbytes, link, rc))
    with open(samples) as f:
        us = sorted(float(r["us"]) for r in csv.DictReader(f))
    resent = labtool.read_counters(counters, n)["resent_pkts"]
    return dict(status="ok", iterations=len(us),
                p50_ms="%.2f" % (labtool.percentile(us, 0.5) / 1e3),
                p99_ms="%.2f" % (labtool.percentile(us, 0.99) / 1e3),
                owner_rcvbuf_errors=after["owner_rcvbuf"] - before["owner_rcvbuf"],
                owner_udp_in_errors=after["owner_in_errors"] - before["owner_in_errors"],
                all_rcvbuf_errors=after["all_rcvbuf"] - before["all_rcvbuf"],
                owner_queue_drops=after["queue"] - before["queue"] if link != "open" else 0,
                owner_if_rx_drops=after["rx"] - before["rx"],
                resent_pkts="" if resent is None else resent)


def one_row(a, lab, algo, layout, n, nbytes, link, help_text):
    row = dict(algo=algo, layout=layout, ranks=n, bytes=nbytes, link=link,
               group=scaling_model.group_size(n) if layout == "2d" else 1)
    if layout == "2d" and "--layout" not in help_text:
        row["status"] = "not built"
    else:
        tag = "%s-%s-%d-%s-%d" % (algo, layout, nbytes, "open" if link == "open" else "tbf",
                                  int(time.time() * 1e3) % 10**9)
        row.update(one_run(a, lab, algo, layout, nbytes, link, help_text, tag))
    print("incast: %s" % ", ".join("%s=%s" % (k, row.get(k, "")) for k in FIELDS), flush=True)
    return row


def run_all(a):
    help_text = scaling_model.bench_help(a.bench_bin)
    rows = []
    links = ["open", "%s/%s" % (a.rate, a.queue)]
    for n in a.ranks:
        with cloudlab.Lab(n) as lab:
            for link in links:
                if link == "open":
                    open_link(lab)
                else:
                    constrain(lab, a.rate, a.queue)
                for nbytes in a.sizes:
                    for algo in a.algos:
                        for layout in a.layouts:
                            rows.append(one_row(a, lab, algo, layout, n, nbytes, link,
                                                help_text))
    return rows


def print_table(rows):
    head = ["algo", "layout", "ranks", "size", "link", "p50 ms", "p99 ms", "owner RcvbufErrors",
            "all RcvbufErrors", "owner queue drops", "owner rx drops", "resent pkts"]
    body = [[r["algo"], r["layout"], r["ranks"], scaling_model.size_label(r["bytes"]), r["link"]] +
            ([r["p50_ms"], r["p99_ms"], r["owner_rcvbuf_errors"], r["all_rcvbuf_errors"],
              r["owner_queue_drops"], r["owner_if_rx_drops"], r["resent_pkts"]]
             if r["status"] == "ok" else [r["status"]] + [""] * 6) for r in rows]
    print(scaling_model.table(head, body))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=scaling_model.parse_list, default=[8, 16])
    ap.add_argument("--sizes", type=lambda t: scaling_model.parse_list(t, scaling_model.parse_size),
                    default=[1 << 20, 16 << 20])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rate", default="2gbit", help="tbf rate on rank 0's port")
    ap.add_argument("--queue", default="1mb", help="tbf queue (limit) on rank 0's port")
    ap.add_argument("--layouts", type=lambda t: scaling_model.parse_list(t, str),
                    default=["flat", "2d"])
    ap.add_argument("--algos", type=lambda t: scaling_model.parse_list(t, str),
                    default=list(ALGOS))
    ap.add_argument("--bench-bin", default=DEFAULT_BIN)
    ap.add_argument("--csv", help="write the rows")
    ap.add_argument("--timeout", type=int, default=300, help="per job, seconds")
    a = ap.parse_args(argv)
    bad = [x for x in a.layouts if x not in ("flat", "2d")]
    if bad:
        ap.error("--layouts: unknown layout '%s' (allowed: flat, 2d)" % bad[0])
    bad = [x for x in a.algos if x not in ALGOS]
    if bad:
        ap.error("--algos: unknown algorithm '%s' (allowed: %s)" % (bad[0], ", ".join(ALGOS)))
    if any(not 2 <= n <= 200 for n in a.ranks):
        ap.error("--ranks: every rank count must be in 2..200")
    if a.iterations < 1:
        ap.error("--iterations must be at least 1")
    if not os.access(a.bench_bin, os.X_OK):
        ap.error("--bench-bin %s is not an executable (./scripts/build.sh builds it)" %
                 a.bench_bin)
    if os.geteuid() != 0:
        ap.error("the lab needs root (network namespaces, veth pairs, tc)")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    cloudlab.install_signal_handlers()
    try:
        rows = run_all(a)
    except KeyboardInterrupt as e:
        print("incast: interrupted (%s); the lab is torn down" % e, file=sys.stderr)
        return 130
    except RuntimeError as e:
        print("incast: %s" % e, file=sys.stderr)
        return 1
    print_table(rows)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in FIELDS})
        print("incast: wrote %s" % a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
