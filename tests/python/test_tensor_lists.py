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
    env = base_env(GLOO_ALGO=algo, GLOO_DEVICE_TRANSPORT="UDP",
                   OPTIREDUCE_UDP_PORT_BASE=free_port(), OPTIREDUCE_UDP_PORT_RANGE=16)
    job = run_job("tensor_list_worker.py", 2, env)
    for res in job.results():
        c = res["stats"]["interposer"]
        assert c["errors"] == 0, c
        if algo == "transpose":
            assert c["tar_calls"] == res["ops"], c
        if algo == "optireduce":
            assert c["optireduce_calls"] == res["ops"], c
            # Past the calibration: bounded operations ran and were checked too.
            assert res["stats"]["optireduce"]["cumulative"]["bounded_ops"] >= 1, res["stats"]


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
