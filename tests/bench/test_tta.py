"""bench/tta (time to accuracy of DDP training): the --quick run trains every configuration
(stock Gloo ring, TAR, OptiReduce mode) to a sane accuracy and writes the curve CSV,
summary CSV and PNG; bad flags are refused with a message naming the flag (exit 2)."""
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


def test_quick_run_trains_every_config(tmp_path):
    lib = torch_lib()
    out = str(tmp_path / "out")
    p = tta("--quick", "--out", out, "--torch-lib", lib, "--repair-budget", "0.5", timeout=110)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    configs = ["ring", "tar", "optireduce"]

    # Progress on the terminal: one line per evaluation per config, then the table.
    for c in configs:
        assert sum(1 for l in p.stdout.splitlines() if (" %s " % c) in l and " step " in l) >= 2, p.stdout
    for label in ("Gloo ring, TCP", "TAR, TCP", "OptiReduce mode, UDP"):
        assert label in p.stdout, p.stdout

    with open(os.path.join(out, "tta_curve.csv")) as f:
        curve = list(csv.DictReader(f))
    with open(os.path.join(out, "tta_summary.csv")) as f:
        summary = {r["config"]: r for r in csv.DictReader(f)}
    assert set(summary) == set(configs), summary
    for c in configs:
        rows = [r for r in curve if r["config"] == c]
        assert len(rows) >= 2, (c, rows)
        walls = [float(r["wall_s"]) for r in rows]
        steps = [int(r["step"]) for r in rows]
        assert all(b > a for a, b in zip(walls, walls[1:])), (c, walls)
        assert all(b > a for a, b in zip(steps, steps[1:])), (c, steps)
        assert walls[0] > 0 and steps[-1] == int(summary[c]["steps"]), (c, rows, summary[c])
        accs = [float(r["accuracy"]) for r in rows]
        # Digits has 10 classes: chance is 10%. Training must actually learn in every
        # configuration, including OptiReduce mode with injected loss.
        assert accs[-1] >= 80.0, (c, accs)
        assert float(summary[c]["final_accuracy_min"]) >= 75.0, summary[c]
        assert float(summary[c]["sync_p50_ms"]) > 0, summary[c]
    # Each configuration really ran the path it names.
    assert summary["ring"]["tar_calls"] == "" and summary["ring"]["optireduce_calls"] == ""
    assert int(summary["tar"]["tar_calls"]) > 0, summary["tar"]
    assert int(summary["optireduce"]["optireduce_calls"]) > 0, summary["optireduce"]
    assert float(summary["optireduce"]["loss"]) > 0, summary["optireduce"]
    # --repair-budget reached the library (as parsed by it), for OptiReduce mode only.
    assert float(summary["optireduce"]["repair_budget"]) == 0.5, summary["optireduce"]
    assert summary["ring"]["repair_budget"] == "" and summary["tar"]["repair_budget"] == ""
    assert summary["optireduce"]["start_grace"] == "budget", summary["optireduce"]  # default
    assert summary["ring"]["start_grace"] == "" and summary["tar"]["start_grace"] == ""

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
    with open(os.path.join(out, "tta_summary.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["optireduce"], rows
    assert rows[0]["start_grace"] == "learned", rows[0]
    assert int(rows[0]["stragglers_given_up"]) >= 0, rows[0]
    assert int(rows[0]["bounded_ops"]) > 0, rows[0]


def test_job_past_timeout_is_killed_and_named(tmp_path):
    p = tta("--quick", "--configs", "ring", "--timeout", "3", "--seed", "987654",
            "--out", str(tmp_path / "o"), timeout=60)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "--timeout 3 s" in p.stderr and "config ring" in p.stderr, p.stderr
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
    with open(os.path.join(out, "tta_summary.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert row["config"] == "tar_udp" and float(row["loss"]) == 0.02, row
    assert int(row["tar_calls"]) > 0 and row["optireduce_calls"] == "0", row
    assert int(row["transport_retransmits"]) > 0, row
    assert float(row["final_accuracy"]) >= 80.0, row
    # Exact and reliable: every replica ends with the same model.
    assert row["final_accuracy_min"] == row["final_accuracy_max"], row


def test_ranks_with_unequal_shares_of_the_data_take_the_same_steps(tmp_path):
    # 1437 training images over 4 ranks: 360 for rank 0, 359 for the others. With batch 2
    # that was 180 steps on rank 0 and 179 elsewhere: rank 0's last allreduce waited for
    # peers already at the final barrier until the operation timeout.
    out = str(tmp_path / "out")
    p = tta("--quick", "--configs", "ring", "--batch", "2", "--epochs", "1", "--timeout", "60",
            "--out", out, timeout=110)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    with open(os.path.join(out, "tta_summary.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["steps"]) == (1437 // 4) // 2, row
