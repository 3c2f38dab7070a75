"""bench/tta --workload charlm: the character-level language model learns in a short
2-rank job, several seeds are summarised (mean, sd, worst replica, divergence), and
--check-replicas compares every rank's parameter hash after every step under 1% and 5%
datagram loss and under a straggler, in OptiReduce mode.

test_optireduce_replicas_identical_every_step: OptiReduce mode keeps every replica
bit-identical, every step, under 1% and 5% loss and under a straggler (no resync call)."""
import csv
import math
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TTA = os.path.join(REPO, "bench", "tta", "tta.py")
PYTHON = "/usr/bin/python3"
# Long enough for OptiReduce mode's bounded operations (the first 20 calibrate, exactly)
# and a model whose gradient spans many datagrams per bucket.
CHECK_ARGS = ["--workload", "charlm", "--quick", "--ranks", "2", "--steps", "80",
              "--d-model", "64", "--eval-every", "40", "--configs", "optireduce",
              "--check-replicas"]
CHECK_ENVS = {"loss1": "loss1:none@0.01", "loss5": "loss5:none@0.05",
              "straggler": "straggler:spike:0.05:80"}


def torch_lib():
    lib = os.environ.get("OPTIREDUCE_TORCH_LIB",
                         os.path.join(REPO, "build", "gloo_ext", "liboptireduce_torch.so"))
    if not os.path.isfile(lib):
        pytest.fail("liboptireduce_torch.so not built at %s (set OPTIREDUCE_TORCH_LIB)" % lib)
    return lib


def tta(*args, timeout=200):
    return subprocess.run([PYTHON, TTA] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def read_rows(out, name):
    with open(os.path.join(out, name)) as f:
        return list(csv.DictReader(f))


def test_charlm_learns_and_seeds_are_summarised(tmp_path):
    out = str(tmp_path / "out")
    p = tta("--workload", "charlm", "--quick", "--ranks", "2", "--configs", "ring,optireduce",
            "--env", "lossless:none", "--seeds", "1,2", "--out", out, "--torch-lib", torch_lib())
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    runs = read_rows(out, "tta_runs.csv")
    assert [(r["config"], r["seed"]) for r in runs] == [
        ("ring", "1"), ("optireduce", "1"), ("ring", "2"), ("optireduce", "2")], runs
    for r in runs:
        assert r["workload"] == "charlm" and r["metric"] == "val_loss", r
        # A uniform guess over the 128 characters costs ln 128 = 4.85 nats: it learned.
        assert float(r["final_metric"]) < math.log(128) - 0.8, r
        # The validation set's sampling error is reported, and small next to what it learned.
        assert 0 < float(r["final_metric_se"]) < 0.1, r
        assert len(r["corpus_sha256"]) == 64, r
        assert float(r["final_metric_worst"]) == float(r["final_metric_max"]), r
    for r in runs:
        if r["config"] == "ring":  # exact: every replica holds the same parameters
            assert float(r["divergence"]) == 0 and r["final_metric_min"] == r["final_metric_max"]
    # The two seeds train different models (initialisation, data order).
    assert runs[0]["final_metric"] != runs[2]["final_metric"], runs
    summary = {r["config"]: r for r in read_rows(out, "tta_summary.csv")}
    assert set(summary) == {"ring", "optireduce"}, summary
    for c, row in summary.items():
        f = [float(r["final_metric"]) for r in runs if r["config"] == c]
        m = sum(f) / 2
        sd = (sum((x - m) ** 2 for x in f)) ** 0.5  # n - 1 = 1
        assert row["seeds"] == "1 2", row
        assert abs(float(row["final_mean"]) - m) < 1e-3 and abs(float(row["final_sd"]) - sd) < 1e-3
        assert float(row["final_worst_replica"]) == max(
            float(r["final_metric_worst"]) for r in runs if r["config"] == c), row
        assert row["reached"] in ("0/2", "1/2", "2/2"), row
    curve = read_rows(out, "tta_curve.csv")
    assert {(r["config"], r["seed"]) for r in curve} == {
        ("ring", "1"), ("ring", "2"), ("optireduce", "1"), ("optireduce", "2")}
    with open(os.path.join(out, "tta.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_missing_corpus_file_is_named(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(REPO, "bench", "tta"))
    import charlm
    # A standard library without the corpus's files (another Python): refused, naming one.
    with pytest.raises(charlm.DataError) as e:
        charlm.check_corpus(str(tmp_path))
    assert os.path.join(str(tmp_path), charlm.FILES[0]) in str(e.value)
    assert "libpython3.11-stdlib" in str(e.value)
    # The split: every 8th file is validation text, none of it in the training text.
    for name in charlm.FILES:
        (tmp_path / name).write_bytes(name.encode() * 3)
    train, val, digest = charlm.read_corpus(str(tmp_path))
    val_names = charlm.FILES[charlm.VAL_EVERY - 1::charlm.VAL_EVERY]
    assert val == b"".join(n.encode() * 3 for n in val_names)
    assert len(train) + len(val) == sum(3 * len(n) for n in charlm.FILES)
    assert all(n.encode() not in train for n in val_names) and len(digest) == 64


_checked = {}


def replica_check(env, tmp_path_factory):
    """The optireduce job of CHECK_ARGS in env (run once per env for this module)."""
    if env not in _checked:
        out = str(tmp_path_factory.mktemp("check-" + env))
        p = tta(*CHECK_ARGS, "--env", CHECK_ENVS[env], "--out", out, "--torch-lib", torch_lib())
        if p.returncode != 0:  # the job itself failed: its output, not an assertion on rows
            raise RuntimeError("tta.py failed (%d):\n%s\n%s" % (p.returncode, p.stdout[-3000:],
                                                                 p.stderr[-3000:]))
        (row,) = read_rows(out, "tta_runs.csv")
        _checked[env] = (row, p.stdout)
    return _checked[env]


def test_replica_check_counts_mismatched_steps(tmp_path_factory):
    row, stdout = replica_check("loss1", tmp_path_factory)
    assert row["config"] == "optireduce" and float(row["loss"]) == 0.01, row
    assert int(row["bounded_ops"]) > 0, row  # OptiReduce mode's bounded path ran
    # Every step was checked; the count is a number of steps.
    assert int(row["checked_steps"]) == int(row["steps"]) == 80, row
    mismatched = int(row["mismatched_steps"])
    assert 0 <= mismatched <= 80, row
    # The first mismatched step is named exactly when there is one.
    assert (row["first_mismatch_step"] != "") == (mismatched > 0), row
    # Two channels agree: final parameters that differ (the files each rank wrote) were
    # also seen by the per-step hash comparison (Gloo allgather) after the last step.
    if float(row["divergence"]) > 0:
        assert mismatched > 0, row
    assert "replica check: loss1/optireduce %d of 80 steps mismatched" % mismatched in stdout


@pytest.mark.parametrize("env", sorted(CHECK_ENVS))
def test_optireduce_replicas_identical_every_step(env, tmp_path_factory):
    row, _ = replica_check(env, tmp_path_factory)
    assert int(row["checked_steps"]) == 80, row
    assert int(row["mismatched_steps"]) == 0, row
    assert float(row["divergence"]) == 0, row
