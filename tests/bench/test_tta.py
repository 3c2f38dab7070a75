"""bench/tta (time to accuracy of DDP training): the --quick runs train every configuration
(stock Gloo ring, TAR, OptiReduce mode) of both workloads (digits, charlm) to a sane metric
and write the curve, runs and summary CSVs and the PNG; --check-replicas counts the steps
where the ranks' parameters differ; bad flags are refused with a message naming the flag
(exit 2)."""
import csv
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TTA = os.path.join(REPO, "bench", "tta", "tta.py")
PYTHON = "/usr/bin/python3"


def torch_lib():
    lib = os.environ.get("OPTIREDUCE_TORCH_LIB",
                         os.path.join(REPO, "build", "gloo_ext", "liboptireduce_torch.so"))
    if not os.path.isfile(lib):
        pytest.fail("liboptireduce_torch.so not built at %s (set OPTIREDUCE_TORCH_LIB)" % lib)
    return lib


def tta(*args, timeout=100):
    return subprocess.run([PYTHON, TTA] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


@pytest.mark.parametrize("args,needles", [
    (["--configs", "ring,foo"], ["--configs", "foo"]),
    (["--env", "nodist"], ["--env", "nodist"]),
    (["--env", "e:weird:3"], ["--env", "weird:3"]),
    (["--env", "e:exp:-5"], ["--env", "out of range"]),
    (["--env", "e:spike:2:50"], ["--env", "out of range"]),
    (["--resync-every", "-1"], ["--resync-every"]),
    (["--env", "e:exp:5@1.5"], ["--env", "1.5"]),
    (["--ranks", "99"], ["--ranks", "99"]),
    (["--target", "0"], ["--target"]),
    (["--epochs", "0"], ["--epochs"]),
    (["--workload", "mnist"], ["--workload", "mnist"]),
    (["--workload", "charlm", "--epochs", "3"], ["--epochs", "digits"]),
    (["--steps", "10"], ["--steps", "charlm"]),
    (["--workload", "charlm", "--steps", "0"], ["--steps"]),
    (["--workload", "charlm", "--d-model", "30", "--heads", "4"], ["--d-model", "--heads"]),
    (["--workload", "charlm", "--target", "-1"], ["--target"]),
    (["--seeds", "1,x"], ["--seeds", "1,x"]),
    (["--seeds", "2,2"], ["--seeds", "2,2"]),
    (["--env", "c:none+bg"], ["--env", "+bg"]),
    (["--env", "c:none+bg2"], ["--env", "--lab"]),
    (["--straggler-rank", "7"], ["--straggler-rank", "7"]),
    (["--bogus"], ["--bogus"]),
    (["--repair-budget", "-1"], ["--repair-budget", "-1"]),
    (["--start-grace", "adaptive"], ["--start-grace", "adaptive"]),
    (["calibrate", "--dists", "none,exp:x"], ["--dists", "exp:x"]),
    (["calibrate", "--dists", "none@2"], ["--dists", "none@2"]),
    (["calibrate", "--dists", "none@0.01"], ["--dists", "--lab"]),
])
def test_bad_flag_is_named(args, needles):
    p = tta(*args, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr


def test_spike_distribution_draws_zero_or_the_spike():
    import sys
    sys.path.insert(0, os.path.join(REPO, "bench", "tta"))
    import dists
    s = dists.Sampler("spike:0.25:80", seed=3)
    draws = [s.draw_ms() for _ in range(4000)]
    assert set(draws) <= {0.0, 80.0}
    assert 850 <= sum(d == 80.0 for d in draws) <= 1150


def read_rows(out, name):
    with open(os.path.join(out, name)) as f:
        return list(csv.DictReader(f))


def test_quick_run_trains_every_config(tmp_path):
    lib = torch_lib()
    out = str(tmp_path / "out")
    p = tta("--quick", "--out", out, "--torch-lib", lib, "--repair-budget", "0.5", timeout=240)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    configs = ["ring", "tar_udp", "optireduce"]  # the default

    # Progress on the terminal: one line per evaluation per config, then the table.
    for c in configs:
        assert sum(1 for l in p.stdout.splitlines() if (" %s " % c) in l and " step " in l) >= 2, p.stdout
    for label in ("Gloo ring, TCP", "TAR, our UDP", "OptiReduce mode, UDP"):
        assert label in p.stdout, p.stdout

    curve = read_rows(out, "tta_curve.csv")
    runs = {r["config"]: r for r in read_rows(out, "tta_runs.csv")}
    summary = {r["config"]: r for r in read_rows(out, "tta_summary.csv")}
    assert set(summary) == set(configs) and set(runs) == set(configs), summary
    for c in configs:
        rows = [r for r in curve if r["config"] == c]
        assert len(rows) >= 2, (c, rows)
        assert {r["workload"] for r in rows} == {"digits"} and {r["seed"] for r in rows} == {"1"}
        walls = [float(r["wall_s"]) for r in rows]
        steps = [int(r["step"]) for r in rows]
        assert all(b > a for a, b in zip(walls, walls[1:])), (c, walls)
        assert all(b > a for a, b in zip(steps, steps[1:])), (c, steps)
        assert walls[0] > 0 and steps[-1] == int(runs[c]["steps"]), (c, rows, runs[c])
        accs = [float(r["metric"]) for r in rows]
        # Digits has 10 classes: chance is 10%. Training must actually learn in every
        # configuration, including OptiReduce mode with injected loss.
        assert accs[-1] >= 80.0, (c, accs)
        assert runs[c]["metric"] == "accuracy_pct", runs[c]
        assert float(runs[c]["final_metric_worst"]) == float(runs[c]["final_metric_min"]) >= 75.0
        assert float(runs[c]["sync_p50_ms"]) > 0, runs[c]
        # One seed: the summary's mean is that run's metric, its sd 0.
        assert float(summary[c]["final_mean"]) == float(runs[c]["final_metric"]), summary[c]
        assert float(summary[c]["final_sd"]) == 0 and summary[c]["seeds"] == "1", summary[c]
        assert float(runs[c]["divergence"]) >= 0, runs[c]
    # Exact configurations end with identical replicas.
    assert float(runs["ring"]["divergence"]) == 0 and float(runs["tar_udp"]["divergence"]) == 0
    # Each configuration really ran the path it names.
    assert runs["ring"]["tar_calls"] == "" and runs["ring"]["optireduce_calls"] == ""
    assert int(runs["tar_udp"]["tar_calls"]) > 0, runs["tar_udp"]
    assert int(runs["optireduce"]["optireduce_calls"]) > 0, runs["optireduce"]
    assert float(runs["optireduce"]["loss"]) > 0, runs["optireduce"]
    # --repair-budget reached the library (as parsed by it), for OptiReduce mode only.
    assert float(summary["optireduce"]["repair_budget"]) == 0.5, summary["optireduce"]
    assert summary["ring"]["repair_budget"] == "" and summary["tar_udp"]["repair_budget"] == ""
    assert summary["optireduce"]["start_grace"] == "learned", summary["optireduce"]  # default
    assert summary["ring"]["start_grace"] == "" and summary["tar_udp"]["start_grace"] == ""
    # The speed-up is over ring's time to target, in the same environment.
    if summary["ring"]["time_to_target_s"] != "":
        assert float(summary["ring"]["speedup_vs_ring"]) == 1.0, summary["ring"]

    with open(os.path.join(out, "tta.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_start_grace_reaches_the_library(tmp_path):
    # --start-grace learned is OPTIREDUCE_START_GRACE for the optireduce config, as the
    # library parsed it; the summary reports how many ranks it gave up (a count, maybe 0).
    lib = torch_lib()
    out = str(tmp_path / "out")
    p = tta("--quick", "--configs", "optireduce", "--out", out, "--torch-lib", lib,
            "--start-grace", "learned", timeout=110)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    rows = read_rows(out, "tta_runs.csv")
    assert [r["config"] for r in rows] == ["optireduce"], rows
    assert rows[0]["start_grace"] == "learned", rows[0]
    assert int(rows[0]["stragglers_given_up"]) >= 0, rows[0]
    assert int(rows[0]["bounded_ops"]) > 0, rows[0]


def test_job_past_timeout_is_killed_and_named(tmp_path):
    p = tta("--quick", "--configs", "ring", "--timeout", "3", "--seed", "987654",
            "--out", str(tmp_path / "o"), timeout=60)
    # A failed job is recorded and the run goes on; the exit status says some failed.
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert "--timeout 3 s" in p.stderr and "config ring" in p.stderr, p.stderr
    (row,) = read_rows(str(tmp_path / "o"), "tta_runs.csv")
    assert row["status"] == "failed" and row["config"] == "ring" and row["error"], row
    (summary,) = read_rows(str(tmp_path / "o"), "tta_summary.csv")
    assert summary["failed"] == "1" and summary["reached"] == "0/1", summary
    # Every rank of the job is gone (killed by process group and reaped).
    left = subprocess.run(["pgrep", "-f", 'tta_worker.py .*"seed": 987654'],
                          stdout=subprocess.PIPE, text=True).stdout
    assert left.strip() == "", left


def test_tar_over_our_udp_retransmits_what_is_lost(tmp_path):
    # --configs tar_udp: TAR over our UDP transport (GLOO_DEVICE_TRANSPORT=UDP); the
    # environment's loss is injected there and retransmitted, so training is exact TAR.
    lib = torch_lib()
    out = str(tmp_path / "out")
    p = tta("--quick", "--configs", "tar_udp", "--env", "lossy:none@0.02", "--out", out,
            "--torch-lib", lib, timeout=110)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "TAR, our UDP" in p.stdout, p.stdout
    (row,) = read_rows(out, "tta_runs.csv")
    assert row["config"] == "tar_udp" and float(row["loss"]) == 0.02, row
    assert int(row["tar_calls"]) > 0 and row["optireduce_calls"] == "0", row
    assert int(row["transport_retransmits"]) > 0, row
    assert float(row["final_metric"]) >= 80.0, row
    # Exact and reliable: every replica ends with the same model.
    assert row["final_metric_min"] == row["final_metric_max"], row
    assert float(row["divergence"]) == 0, row


def test_ranks_with_unequal_shares_of_the_data_take_the_same_steps(tmp_path):
    # 1437 training images over 4 ranks: 360 for rank 0, 359 for the others. With batch 2
    # that was 180 steps on rank 0 and 179 elsewhere: rank 0's last allreduce waited for
    # peers already at the final barrier until the operation timeout.
    out = str(tmp_path / "out")
    p = tta("--quick", "--configs", "ring", "--batch", "2", "--epochs", "1", "--timeout", "60",
            "--out", out, timeout=110)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    (row,) = read_rows(out, "tta_runs.csv")
    assert int(row["steps"]) == (1437 // 4) // 2, row
