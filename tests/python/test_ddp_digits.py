"""DDP training: with GLOO_ALGO=optireduce over optireduce's UDP device with 1% injected
packet loss the replicas stay one model and learn as well as stock Gloo's ring over TCP;
4 ranks over UDP with transpose and optireduce; DDP's default 25 MB buckets through TAR."""

import pytest

from conftest import base_env


def train(run_job, env, args=(), exact=True, world=2):
    job = run_job("ddp_digits_worker.py", world, env, args, timeout=400)
    results = job.results()
    if exact:
        # Exact allreduce keeps DDP's replicas identical: every rank evaluates one model.
        assert all(abs(r["accuracy"] - results[0]["accuracy"]) < 1e-9 for r in results), results
    return results


def test_optireduce_matches_stock_ring(run_job):
    stock = train(run_job, base_env(OPTIREDUCE_TORCH_LIB=None))  # optireduce not loaded
    assert stock[0]["stats"] is None
    # OptiReduce mode under 1% loss: every rank applies the same bytes (counted data is
    # repaired, what is left out is zero everywhere and carried into the next step), so
    # the two replicas are one model.
    ours = train(run_job,
                 base_env(GLOO_ALGO="optireduce", GLOO_DEVICE_TRANSPORT="UDP",
                          OPTIREDUCE_FAULTS="drop=0.01,seed=11"),
                 ["--import-optireduce"])
    base_acc = stock[0]["accuracy"]
    our_acc = ours[0]["accuracy"]
    print(f"digits test accuracy: stock ring {base_acc:.2f}%, optireduce {our_acc:.2f}%")
    assert base_acc > 90, stock
    # One run each, not a statistic: the Hadamard transform rounds differently and a
    # deferred part lands one step later, which moves a few of the 360 test images either
    # way (1 image = 0.28 points). Within 3 points (11 images) of the stock run says it
    # learned as well; accuracy across seeds is the results page's time-to-accuracy section.
    assert abs(our_acc - base_acc) <= 3.0, (base_acc, our_acc)
    for res in ours:
        c = res["stats"]["interposer"]
        steps = res["steps"]
        # Two buckets per step after DDP's bucket rebuild (one in the first step), all
        # through the OptiReduce path.
        assert c["optireduce_calls"] >= 2 * steps - 1, (c, steps)
        assert c["forwarded_calls"] == 0 and c["errors"] == 0, c
        t = res["stats"]["transport"]
        assert t["devices"] >= 1, t
        # The bounded mode ran (after its calibration operations) and met real loss: it
        # either absorbed it or, above OPTIREDUCE_MAX_LOSS, repaired it.
        o = res["stats"]["optireduce"]["cumulative"]
        assert o["bounded_ops"] > 0 and o["calibration_ops"] > 0, o
        assert o["bytes_received"] < o["bytes_expected"] or o["repaired_ops"] > 0, o


@pytest.mark.parametrize("algo", ["transpose", "optireduce"])
def test_four_ranks_over_udp(run_job, algo):
    # 4 ranks, no injected loss: TAR is exact, and OptiReduce mode's result is the same
    # on every rank (each rank's shard is reduced once and gathered by all), so every
    # replica stays one model. Exact TAR ends at 96.7%; in OptiReduce mode a rank that the
    # host's scheduling makes late is given up and its contribution lands one step later,
    # which at the trained model's plateau moves the accuracy by about a point (a
    # simulation of 25 such deferrals in 165 steps stayed above 95.5% over 40 seeds), so
    # 90% says it learned without depending on the host's timing.
    ours = train(run_job, base_env(GLOO_ALGO=algo, GLOO_DEVICE_TRANSPORT="UDP"),
                 ["--import-optireduce"], world=4)
    assert ours[0]["accuracy"] > 90, ours
    for res in ours:
        c = res["stats"]["interposer"]
        taken = c["tar_calls"] if algo == "transpose" else c["optireduce_calls"]
        assert taken >= 2 * res["steps"] - 1, (c, res["steps"])
        assert c["forwarded_calls"] == 0 and c["errors"] == 0, c
        assert res["stats"]["transport"]["tx_packets"] > 0


def test_default_25mb_buckets(run_job):
    # DDP's default bucket_cap_mb=25 on a ~28 MB model: each step allreduces a full 25 MB
    # bucket (plus the rest). TAR over our UDP device must give what stock Gloo's ring over
    # TCP gives (to float rounding: the sums run in another order), the same on both ranks.
    import math
    runs = {
        "stock": run_job("ddp_big_bucket_worker.py", 2, base_env(OPTIREDUCE_TORCH_LIB=None),
                         timeout=300).results(),
        "tar": run_job("ddp_big_bucket_worker.py", 2,
                       base_env(GLOO_ALGO="transpose", GLOO_DEVICE_TRANSPORT="UDP"),
                       ["--import-optireduce"], timeout=300).results(),
    }
    assert runs["stock"][0]["stats"] is None
    for name, results in runs.items():
        assert results[0]["fingerprint"] == results[1]["fingerprint"], name  # one model
    for res in runs["tar"]:
        c = res["stats"]["interposer"]
        # Every gradient byte of every step went through TAR, in 2 buckets per step after
        # DDP's bucket rebuild (one in the first step).
        assert c["bytes_tar"] == res["steps"] * res["grad_bytes"], c
        assert c["tar_calls"] >= 2 * res["steps"] - 1, c
        assert c["forwarded_calls"] == 0 and c["errors"] == 0, c
        assert res["stats"]["transport"]["tx_packets"] > 0
    for a, b in zip(runs["stock"][0]["fingerprint"], runs["tar"][0]["fingerprint"]):
        for x, y in zip(a, b):
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6), (a, b)
