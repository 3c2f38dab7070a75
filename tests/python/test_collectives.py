"""torch.distributed collectives through liboptireduce_torch.so, 2 and 4 real processes.

For every (transport, GLOO_ALGO) the worker checks each result exactly (or to rounding for
Hadamard-transformed float sums) and the test checks the interposer's counters: the path
GLOO_ALGO asks for must really have run — a TAR/OptiReduce run that silently fell back to
stock Gloo fails here.
"""

import pytest

from conftest import base_env, free_port, have_dpdk, memif_mesh_eal, torch_lib

ALGOS = ["ring", "transpose", "optireduce"]


def expect_counters(results, algo, transport):
    for res in results:
        ran, stats = res["ran"], res["stats"]
        assert stats is not None, res
        c = stats["interposer"]
        assert stats["interposed"] is True
        assert c["calls"] == ran["allreduce"], (c, ran)
        assert c["errors"] == 0, c
        if algo != "optireduce":
            assert ran["repeated_exact"] == ran["repeated"], ran
        assert c["forwarded_calls"] == (c["forwarded_ring"] + c["forwarded_explicit_algorithm"]
                                        + c["forwarded_unsupported_type"]
                                        + c["forwarded_unsupported_op"]), c
        if algo == "ring":
            assert c["forwarded_ring"] == ran["allreduce"], c
            assert c["tar_calls"] == 0 and c["optireduce_calls"] == 0, c
        else:
            taken = c["tar_calls"] if algo == "transpose" else c["optireduce_calls"]
            other = c["optireduce_calls"] if algo == "transpose" else c["tar_calls"]
            assert taken == ran["allreduce_supported"], (algo, c, ran)
            assert other == 0, c
            assert c["forwarded_unsupported_op"] == ran["allreduce_unsupported_op"], c
            assert c["forwarded_unsupported_type"] == ran["allreduce_unsupported_type"], c
        assert ran["sync_parameters"] == 1, ran  # optireduce.sync_parameters checked
        if algo == "optireduce" and transport in ("UDP", "DPDK"):
            # The repeated same-size calls outlast the calibration: OptiReduce mode ran
            # bounded operations on this transport, not only reliable TAR.
            cum = stats["optireduce"]["cumulative"]
            assert cum["bounded_ops"] >= 1, cum
            # Every repeated call is checked exactly but for those flagged deferred or
            # carried (the same on every rank).
            assert ran["repeated_exact"] >= ran["repeated"] - cum["damaged_ops"] - cum["carried_in_ops"], (ran, cum)
            assert cum["bounded_ops"] + cum["calibration_ops"] <= ran["allreduce_supported"], cum
        t = stats["transport"]
        if transport in ("UDP", "DPDK"):
            # The traffic went over optireduce's device, not Gloo's TCP.
            assert t["devices"] >= 1 and t["tx_packets"] > 0 and t["rx_packets"] > 0, t
        else:
            assert t["devices"] == 0, t


def job_env(algo, transport, loading):
    env = base_env(GLOO_ALGO=algo)
    if transport != "TCP":
        env["GLOO_DEVICE_TRANSPORT"] = transport
    if transport == "UDP" and algo == "optireduce":
        # A fixed port range shared by all ranks of the host: each binds the next free one.
        env["OPTIREDUCE_UDP_PORT_BASE"] = str(free_port())
        env["OPTIREDUCE_UDP_PORT_RANGE"] = "16"
    if loading == "preload":
        env["LD_PRELOAD"] = torch_lib()
    return env


# 2 ranks: every transport x algorithm; the loading mode alternates between LD_PRELOAD and
# `import optireduce` so both are covered on both transports.
@pytest.mark.parametrize("transport", ["TCP", "UDP"])
@pytest.mark.parametrize("algo", ALGOS)
def test_two_ranks(run_job, transport, algo):
    loading = "preload" if (ALGOS.index(algo) + (transport == "UDP")) % 2 else "import"
    args = ["--import-optireduce"] if loading == "import" else []
    job = run_job("collectives_worker.py", 2, job_env(algo, transport, loading), args)
    expect_counters(job.results(), algo, transport)


# 4 ranks (2 cores: each job takes a while): UDP with every algorithm, TCP with TAR.
@pytest.mark.parametrize("transport,algo", [("UDP", "ring"), ("UDP", "transpose"),
                                            ("UDP", "optireduce"), ("TCP", "transpose")])
def test_four_ranks(run_job, transport, algo):
    job = run_job("collectives_worker.py", 4, job_env(algo, transport, "import"),
                  ["--import-optireduce", "--small"], timeout=400)
    expect_counters(job.results(), algo, transport)


def test_torch_multiprocessing_spawn():
    import os
    import subprocess

    from conftest import HERE, PYTHON

    env = base_env(GLOO_ALGO="transpose", GLOO_DEVICE_TRANSPORT="UDP")
    p = subprocess.run([PYTHON, os.path.join(HERE, "spawn_job.py")], env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.split("\n")[:2])
    assert lines == ["0 1 1", "1 1 1"], p.stdout


# DPDK over memif: every algorithm with 2 ranks, OptiReduce mode also with 4.
@pytest.mark.parametrize("ranks,algo", [(2, "ring"), (2, "transpose"), (2, "optireduce"),
                                        (4, "optireduce")])
def test_dpdk_memif(run_job, ranks, algo):
    if not have_dpdk():
        pytest.skip("this build has no DPDK device")

    def rank_env(rank, job_dir):
        env = job_env(algo, "DPDK", "import")
        env["OPTIREDUCE_EAL_ARGS"] = memif_mesh_eal(rank, ranks, job_dir)
        return env

    job = run_job("collectives_worker.py", ranks, rank_env, ["--import-optireduce", "--small"],
                  timeout=400)
    expect_counters(job.results(), algo, "DPDK")


@pytest.mark.parametrize("algo", ["ring", "optireduce"])
def test_dpdk_memif_new_group(run_job, algo):
    # torch makes a device per process group; over DPDK they are all the process's one
    # device (one EAL, one memif port), and each group's traffic stays in its own context.
    if not have_dpdk():
        pytest.skip("this build has no DPDK device")

    def rank_env(rank, job_dir):
        env = job_env(algo, "DPDK", "import")
        env["OPTIREDUCE_EAL_ARGS"] = memif_mesh_eal(rank, 2, job_dir)
        env["OPTIREDUCE_HADAMARD"] = "0"  # exact float sums in OptiReduce mode too
        return env

    job = run_job("new_group_worker.py", 2, rank_env, timeout=120)
    for res in job.results():
        assert res["checked"] == 3 * 3 + 2 * 3 + 1, res
        t = res["stats"]["transport"]
        # Three groups, one device: a second DPDK device would have failed to start.
        assert t["devices"] == 1 and t["tx_packets"] > 0 and t["rx_packets"] > 0, t
        c = res["stats"]["interposer"]
        assert c["errors"] == 0, c
        if algo == "optireduce":
            assert c["optireduce_calls"] == 3 * 3 + 2 * 3, c
