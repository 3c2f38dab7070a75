"""DDP training reaches the same accuracy with GLOO_ALGO=optireduce (over optireduce's UDP
device with 1% injected packet loss) as with stock Gloo's ring over TCP."""

from conftest import base_env


def train(run_job, env, args=()):
    job = run_job("ddp_digits_worker.py", 2, env, args, timeout=300)
    results = job.results()
    # DDP keeps the replicas identical: both ranks evaluate the same model.
    assert abs(results[0]["accuracy"] - results[1]["accuracy"]) < 1e-9, results
    return results


def test_optireduce_matches_stock_ring(run_job):
    stock = train(run_job, base_env(OPTIREDUCE_TORCH_LIB=None))  # optireduce not loaded
    assert stock[0]["stats"] is None
    ours = train(run_job,
                 base_env(GLOO_ALGO="optireduce", GLOO_DEVICE_TRANSPORT="UDP",
                          OPTIREDUCE_FAULTS="drop=0.01,seed=11"),
                 ["--import-optireduce"])
    base_acc, our_acc = stock[0]["accuracy"], ours[0]["accuracy"]
    print(f"digits test accuracy: stock ring {base_acc:.2f}%, optireduce {our_acc:.2f}%")
    assert base_acc > 90, stock
    assert abs(our_acc - base_acc) <= 1.0, (base_acc, our_acc)
    for res in ours:
        c = res["stats"]["interposer"]
        steps = res["steps"]
        # Two buckets per step after DDP's bucket rebuild (one in the first step), all
        # through the OptiReduce path.
        assert c["optireduce_calls"] >= 2 * steps - 1, (c, steps)
        assert c["forwarded_calls"] == 0 and c["errors"] == 0, c
        t = res["stats"]["transport"]
        # Loss was really injected and recovered from.
        assert t["devices"] >= 1 and t["retransmits"] > 0, t
