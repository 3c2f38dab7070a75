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
