"""Call shapes through torch with real processes.

`dist.all_reduce_multigpu` on CPU tensors reaches gloo::allreduce with several outputs and
no inputs; every algorithm must sum all tensors of all ranks into each of them, as stock
Gloo does (the worker checks every element). And OptiReduce mode with ranks that pass
tensors of different sizes: both raise naming both sizes, instead of returning garbage.
"""

import pytest

from conftest import base_env, free_port


@pytest.mark.parametrize("algo", ["ring", "transpose", "optireduce"])
def test_all_reduce_multigpu_sums_every_tensor_of_every_rank(run_job, algo):
    # OptiReduce mode: a repair budget of 10 bounds keeps a rank the host deschedules in
    # the operation; one later than that is left out and the operation flagged, and the
    # worker checks only unflagged results against the exact sum.
    env = base_env(GLOO_ALGO=algo, GLOO_DEVICE_TRANSPORT="UDP",
                   OPTIREDUCE_UDP_PORT_BASE=free_port(), OPTIREDUCE_UDP_PORT_RANGE=16,
                   OPTIREDUCE_REPAIR_BUDGET=10)
    job = run_job("tensor_list_worker.py", 2, env)
    for res in job.results():
        c = res["stats"]["interposer"]
        assert c["errors"] == 0, c
        if algo != "optireduce":
            assert res["exact_checked"] == res["ops"], res
        if algo == "transpose":
            assert c["tar_calls"] == res["ops"], c
        if algo == "optireduce":
            assert c["optireduce_calls"] == res["ops"], c
            cumulative = res["stats"]["optireduce"]["cumulative"]
            # Past the calibration (20 operations of the size): bounded operations ran,
            # and at least one of them was checked exact.
            assert cumulative["bounded_ops"] >= 1, res["stats"]
            assert res["exact_checked"] > cumulative["calibration_ops"], res
            flagged = cumulative["damaged_ops"] + cumulative["carried_in_ops"]
            assert res["exact_checked"] >= res["ops"] - flagged, res


def test_optireduce_mode_with_different_sizes_raises_on_every_rank(run_job):
    # A repair budget of 10 bounds: a rank that the host deschedules is still waited for
    # (not given up as a straggler before its packets, which show the mismatch, arrive).
    env = base_env(GLOO_ALGO="optireduce", GLOO_DEVICE_TRANSPORT="UDP",
                   OPTIREDUCE_UDP_PORT_BASE=free_port(), OPTIREDUCE_UDP_PORT_RANGE=16,
                   OPTIREDUCE_REPAIR_BUDGET=10)
    job = run_job("tensor_list_worker.py", 2, env, ["--mismatch"])
    for rank, res in enumerate(job.results()):
        assert res["error"], f"rank {rank} returned from an allreduce whose sizes differ"
        assert str(res["mine"]) in res["error"] and str(res["other"]) in res["error"], res
        assert res["nan"], res
        c = res["stats"]["interposer"]
        assert c["errors"] == 1, c
