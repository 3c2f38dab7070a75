"""The main job (bench/demo.py, run by ./scripts/demo.sh) at small size: 2 ranks, 20 timed
iterations, in the lab (root) and locally. The table has the three rows, every row met the
same injected loss (measured on the lab's links), and the CSVs and the CDF PNG exist."""
import csv
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(REPO, "bench", "demo.py")
ROWS = ["Gloo ring_chunked, Gloo TCP", "TAR, our UDP", "OptiReduce mode, our UDP"]
SMALL = ["--ranks", "2", "--iterations", "20", "--elements", "262144"]


def demo(bench_bin, *args, user=None, timeout=240):
    cmd = [sys.executable, DEMO, "--bench-bin", bench_bin] + list(args)
    if user is not None:
        cmd = ["setpriv", "--reuid", user, "--regid", user, "--clear-groups"] + cmd
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))


def table(stdout):
    """{row label: [p50, p99, p99/p50, vs Gloo, injected %, deferred %]} of the table."""
    rows = {}
    for line in stdout.splitlines():
        for label in ROWS:
            if line.startswith(label):
                cells = line[len(label):].split()
                rows[label] = [float(c.rstrip("x")) for c in cells[:6]]
    return rows


def check_outputs(out):
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [r["algo"] for r in summary] == ["allreduce_ring_chunked@tcp", "transpose@udp",
                                            "optireduce@udp"]
    assert all(int(r["samples"]) == 20 for r in summary), summary
    with open(out / "samples.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == 60
    assert (out / "cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return summary


def lab_leftovers():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return [l for l in out.splitlines() if l.startswith("orl-")]


@pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (netns, veth, tc)")
def test_lab_rows_meet_the_same_injected_loss(bench_bin, tmp_path):
    before = lab_leftovers()
    p = demo(bench_bin, *SMALL, "--loss", "0.02", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "cloud lab: 2 ranks" in p.stdout and "2% per-packet loss" in p.stdout, p.stdout
    rows = table(p.stdout)
    assert list(rows) == ROWS, p.stdout
    for label, cells in rows.items():
        # Every row's packets crossed the same 2% drop: the share the links lost is the
        # same for all three (within sampling noise of a few thousand packets).
        assert 1.0 < cells[4] < 3.5, (label, p.stdout)
    assert rows[ROWS[0]][3] == 1.0  # the Gloo row is the reference of "p99 vs Gloo"
    summary = check_outputs(tmp_path)
    assert all(1.0 < float(r["wire_loss_pct"]) < 3.5 for r in summary), summary
    assert str(tmp_path / "cdf.png") in p.stdout
    assert lab_leftovers() == before


def test_local_rows_meet_no_loss(bench_bin, tmp_path):
    p = demo(bench_bin, *SMALL, "--where", "local", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "LOCAL comparison (not the lab)" in p.stdout and "no packet loss for any row" in \
        p.stdout, p.stdout
    rows = table(p.stdout)
    assert list(rows) == ROWS, p.stdout
    assert all(cells[4] == 0.0 for cells in rows.values()), p.stdout
    assert rows[ROWS[0]][3] == 1.0
    check_outputs(tmp_path)


def test_not_root_says_why_and_runs_local(bench_bin, tmp_path):
    out = tmp_path / "out"
    if os.geteuid() != 0:
        user = None
    else:
        # As root: the same run as user nobody, writing to a directory it may write to.
        out = tempfile.mkdtemp(prefix="optireduce-demo-test-")
        try:
            user = str(pwd.getpwnam("nobody").pw_uid)
        except KeyError:
            pytest.skip("no user 'nobody' to run as")
        os.chmod(out, 0o777)
        if subprocess.run(["setpriv", "--reuid", user, "test", "-x", bench_bin]).returncode:
            shutil.rmtree(out)
            pytest.skip("user nobody cannot run %s" % bench_bin)
    try:
        p = demo(bench_bin, *SMALL, "--iterations", "5", "--out", str(out), user=user)
    finally:
        if user is not None:
            shutil.rmtree(out, ignore_errors=True)
    assert p.returncode == 0, p.stderr
    assert re.search(r"not root, so no cloud lab .*LOCAL comparison", p.stderr), p.stderr
    assert "LOCAL comparison (not the lab)" in p.stdout
    assert list(table(p.stdout)) == ROWS


def test_bad_flags_are_named(bench_bin, tmp_path):
    p = demo(bench_bin, "--ranks", "99", "--out", str(tmp_path))
    assert p.returncode == 2 and "--ranks takes a number from 2 to 16, got 99" in p.stderr
    p = demo(bench_bin, "--loss", "1.5", "--out", str(tmp_path))
    assert p.returncode == 2 and "--loss must be a probability in [0, 1), got 1.5" in p.stderr
    assert not any(tmp_path.iterdir())
