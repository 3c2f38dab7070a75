"""OPTIREDUCE_LAYOUT reaches Transpose AllReduce in an unchanged torch script."""

import pytest

from conftest import base_env


def env(layout):
    return base_env(GLOO_ALGO="transpose", GLOO_DEVICE_TRANSPORT="UDP",
                    OPTIREDUCE_LAYOUT=layout)


@pytest.mark.parametrize("layout", ["flat", "two-level", "auto"])
def test_a_layout_every_rank_names_gives_the_exact_sum(run_job, layout):
    for res in run_job("layout_worker.py", 2, env(layout), timeout=120).results():
        assert res["error"] is None and res["exact"], res


def test_a_group_size_that_does_not_divide_the_ranks_raises_on_every_rank(run_job):
    # Were the variable ignored, the allreduce would succeed.
    results = run_job("layout_worker.py", 2, env("two-level:3"), timeout=120).results()
    for res in results:
        assert res["error"] is not None, res
        assert "group size 3 does not divide the 2" in res["error"], res


def test_optireduce_mode_runs_the_two_level_layout_with_the_same_bytes_on_every_rank(run_job):
    # 4 ranks in groups of 2; 25 allreduces: the first 20 calibrate (exact two-level TAR),
    # the last ones run bounded across the groups. The last result is the same bytes on
    # every rank, and the sum to the Hadamard transform's rounding unless the operation
    # flagged a deferred part (a rank the host held back past the start grace: its data
    # is carried, not lost; the flag is the same on every rank).
    env = base_env(GLOO_ALGO="optireduce", GLOO_DEVICE_TRANSPORT="UDP",
                   OPTIREDUCE_LAYOUT="two-level:2")
    results = run_job("layout_worker.py", 4, env, ["25"], timeout=240).results()
    for res in results:
        assert res["error"] is None, res
        last = res["stats"]["last"]
        assert last["group_size"] == 2 and last["mode"] == "bounded", last
        assert last["damaged"] == results[0]["stats"]["last"]["damaged"], results
        if not last["damaged"] and not last["carried_in"]:
            assert res["max_error"] <= 1e-4 * 10, res
    assert len({res["sha256"] for res in results}) == 1, results
