"""bench/scaling_model.py: the per-rank counts of ring, flat and 2D TAR are the documented
formulas, the fit recovers known costs from synthetic measurements, the CLI prints and
writes its tables, and measure runs optireduce-bench; bench/lab/incast.py refuses bad flags."""
import csv
import os
import random
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import scaling_model as sm  # noqa: E402

MODEL = os.path.join(REPO, "bench", "scaling_model.py")
INCAST = os.path.join(REPO, "bench", "lab", "incast.py")
NS = [2, 3, 4, 6, 8, 12, 16, 64, 100, 256, 1024]


def test_group_size_is_the_largest_divisor_at_most_the_square_root():
    assert [sm.group_size(n) for n in (2, 4, 7, 8, 12, 16, 18, 64, 128, 256, 1024)] == \
        [1, 2, 1, 2, 3, 4, 3, 8, 8, 16, 32]


@pytest.mark.parametrize("n", NS)
def test_counts_are_the_formulas_unpipelined(n):
    b = 25 << 20
    wire = 2.0 * (n - 1) / n * b
    ring = sm.counts("ring", n, b, chunk=0)
    assert (ring["messages"], ring["rounds"], ring["fanin"]) == (8 * n - 9, 2 * (n - 1), 1)
    assert ring["bytes"] == pytest.approx(wire)
    flat = sm.counts("flat", n, b, chunk=0)
    assert (flat["messages"], flat["rounds"], flat["fanin"]) == (3 * (n - 1), 2 * (n - 1), n - 1)
    assert flat["bytes"] == pytest.approx(wire)
    g = sm.group_size(n)
    h = n // g
    two = sm.counts("2d", n, b, chunk=0)
    assert two["group"] == g
    assert two["rounds"] == 2 * (g - 1) + 2 * (h - 1)
    assert two["messages"] == 3 * (g - 1) + 3 * (h - 1)
    assert two["fanin"] == max(g - 1, h - 1)
    assert two["bytes"] == pytest.approx(wire)  # the same bytes as flat TAR, fewer messages
    if g == 1:
        assert two["messages"] == flat["messages"]


def test_pipeline_chunks_multiply_the_shard_messages():
    b, chunk = 16 << 20, 1 << 20
    # 4 ranks: 4 MiB shards in 4 chunks each; 2(N-1) shard transfers + N-1 fingerprints.
    assert sm.counts("flat", 4, b, chunk)["messages"] == 2 * 3 * 4 + 3
    # 16 ranks, G = 4: 4 MiB group shards (4 chunks), 1 MiB pieces across groups (1 chunk).
    assert sm.counts("2d", 16, b, chunk)["messages"] == 2 * 3 * 4 + 2 * 3 * 1 + 3 + 3
    assert sm.counts("ring", 16, b, chunk)["messages"] == 8 * 16 - 9  # not chunked by TAR's rule


def synthetic(costs, cores=2, noise=0.0, seed=1):
    rnd = random.Random(seed)
    rows = []
    for algo in ("ring", "flat"):
        for n in (2, 4, 8, 12, 16):
            for b in (256 << 10, 1 << 20, 4 << 20, 16 << 20):
                t = sm.predict_us(algo, n, b, costs[algo], cores)
                rows.append(dict(algo=algo, ranks=n, bytes=b, cores=cores,
                                 p50_us=t * (1 + rnd.uniform(-noise, noise))))
    return rows


def test_fit_recovers_known_costs():
    costs = {"ring": (30.0, 0.5, 6.0), "flat": (40.0, 0.45, 7.0)}
    fitted = sm.fit_measured(synthetic(costs))
    for algo, want in costs.items():
        got, err, points = fitted[algo]
        assert points == 20 and err < 1e-9
        assert got == pytest.approx(want, rel=1e-6)


def test_2d_tar_is_fitted_to_its_own_points_else_takes_flat_tars_costs():
    costs = {"ring": (30.0, 0.5, 6.0), "flat": (40.0, 0.45, 7.0), "2d": (70.0, 0.45, 7.0)}
    rows = synthetic(costs)
    rows += [dict(algo="2d", ranks=n, bytes=b, cores=2,
                  p50_us=sm.predict_us("2d", n, b, costs["2d"], 2))
             for n in (4, 8, 16) for b in (256 << 10, 1 << 20, 4 << 20, 16 << 20)]
    args = sm.parse_args([])
    got = sm.costs_of(args, sm.fit_measured(rows))
    assert got["2d"] == pytest.approx(costs["2d"], rel=1e-6)
    assert got["flat"] == pytest.approx(costs["flat"], rel=1e-6)
    without = sm.costs_of(args, sm.fit_measured(synthetic(costs)))
    assert without["2d"] == without["flat"]


def test_fit_is_close_under_noise_and_never_negative():
    costs = {"ring": (30.0, 0.5, 6.0), "flat": (40.0, 0.45, 7.0)}
    fitted = sm.fit_measured(synthetic(costs, noise=0.05))
    for algo, want in costs.items():
        got = fitted[algo][0]
        assert all(v >= 0 for v in got)
        assert got[1] == pytest.approx(want[1], rel=0.15)
    # A term the data cannot carry is 0, not negative.
    rows = [([1.0, 10.0, 0.0], 10.0), ([2.0, 20.0, 0.0], 20.0), ([3.0, 1.0, 0.0], 3.0)]
    coef, _ = sm.fit(rows)
    assert all(v >= 0 for v in coef)


def test_loss_adds_stalls_and_ring_stalls_most():
    b = 25 << 20
    for algo in sm.ALGOS:
        assert sm.expected_stalls(algo, 64, b, 0.0, 9000) == 0
    s = {a: sm.expected_stalls(a, 64, b, 0.001, 9000) for a in sm.ALGOS}
    assert 0 < s["flat"] <= 2 and 0 < s["2d"] <= 4 and s["ring"] > s["2d"]


def run(args, **kw):
    return subprocess.run([sys.executable, MODEL] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120, **kw)


def test_cli_prints_the_table_and_writes_csvs(tmp_path):
    measured = tmp_path / "m.csv"
    costs = {"ring": (30.0, 0.5, 6.0), "flat": (40.0, 0.45, 7.0)}
    with open(measured, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["algo", "ranks", "bytes", "cores", "p50_us"])
        w.writeheader()
        w.writerows(synthetic(costs))
    pred, fit, check = tmp_path / "p.csv", tmp_path / "f.csv", tmp_path / "c.csv"
    p = run(["--measured", str(measured), "--csv", str(pred), "--fit-csv", str(fit),
             "--check-csv", str(check)])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for text in ("Gloo ring_chunked", "flat TAR", "2D TAR", "Model vs measured", "fan-in",
                 "model/measured", "2D TAR beats flat TAR by 10% or more from"):
        assert text in out, out
    with open(pred) as f:
        rows = list(csv.DictReader(f))
    assert {int(r["ranks"]) for r in rows} >= {64, 256, 1024}
    assert {r["algo"] for r in rows} == {"ring", "flat", "2d"}
    with open(check) as f:
        ratios = [float(r["ratio"]) for r in csv.DictReader(f)]
    assert len(ratios) == 40 and all(abs(r - 1) < 1e-3 for r in ratios)
    with open(fit) as f:
        got = {r["algo"]: float(r["alpha_us"]) for r in csv.DictReader(f)}
    assert got == pytest.approx({"ring": 30.0, "flat": 40.0}, rel=1e-4)


def test_cli_without_measurements_uses_given_costs_and_names_bad_flags():
    p = run(["--ranks-to", "64", "--predict", "64", "--flat", "10:0.5:1"])
    assert p.returncode == 0 and "flag" in p.stdout and "Model vs measured" not in p.stdout
    for args, flag in ((["--flat", "1:2"], "--flat"), (["--loss", "1.5"], "--loss"),
                       (["measure", "--csv", "x", "--algos", "bogus"], "--algos"),
                       (["measure", "--csv", "x", "--repeat", "0"], "--repeat")):
        p = run(args)
        assert p.returncode == 2 and flag in p.stderr, (args, p.stderr)


def test_measure_runs_the_bench(bench_bin, tmp_path):
    # 2D TAR has groups at 4 ranks (2 of 2), none at 2: it is measured only at 4.
    out = tmp_path / "m.csv"
    p = run(["measure", "--bench-bin", bench_bin, "--csv", str(out), "--ranks", "2,4",
             "--sizes", "64K", "--iterations", "2", "--algos", "ring,flat,2d"])
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    got = {(r["algo"], int(r["ranks"])) for r in rows}
    assert got == {("ring", 2), ("flat", 2), ("ring", 4), ("flat", 4), ("2d", 4)}, rows
    assert all(float(r["p50_us"]) > 0 and r["runs"] == "1" for r in rows)


def test_incast_names_bad_flags():
    p = subprocess.run([sys.executable, INCAST, "--layouts", "flat,ring"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2 and "--layouts" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, INCAST, "--algos", "transpose,ring"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2 and "--algos: unknown algorithm 'ring'" in p.stderr, p.stderr
