"""The hook path of patches/gloo-0001, in a real torch job: a Gloo rebuilt with the patch
(OPTIREDUCE_GLOO_SOURCE = the directory of that build, holding libgloo.so.0) replaces the
system's through LD_LIBRARY_PATH, torch's calls are bound when torch loads (LD_BIND_NOW) and
liboptireduce_torch.so is loaded after torch, so its own gloo::allreduce cannot interpose:
only the patched Gloo's hook can run TAR (counted as hook_calls). Opt-in: skipped, saying so, when OPTIREDUCE_GLOO_SOURCE is unset.
"""

import glob
import os

import pytest

from conftest import base_env

GLOO_DIR = os.environ.get("OPTIREDUCE_GLOO_SOURCE", "")


@pytest.fixture(scope="module")
def patched_libgloo():
    if not GLOO_DIR:
        pytest.skip("OPTIREDUCE_GLOO_SOURCE is unset: set it to the build directory of a Gloo "
                    "with patches/gloo-0001 applied (patches/README.md)")
    found = sorted(glob.glob(os.path.join(GLOO_DIR, "**", "libgloo.so.0"), recursive=True))
    assert found, f"OPTIREDUCE_GLOO_SOURCE={GLOO_DIR}: no libgloo.so.0 below it"
    lib = os.path.realpath(found[0])
    with open(lib, "rb") as f:
        assert b"optireduce_gloo_allreduce" in f.read(), \
            f"{lib} is not patched (no optireduce_gloo_allreduce hook)"
    return lib


def env_for(libgloo, algo, transport="TCP"):
    # LD_BIND_NOW: libtorch's calls bind to libgloo when torch is imported, as in a torch
    # that bundles Gloo; liboptireduce, loaded later, cannot interpose them.
    env = base_env(GLOO_ALGO=algo, LD_LIBRARY_PATH=os.path.dirname(libgloo), LD_BIND_NOW="1")
    if transport != "TCP":
        env["GLOO_DEVICE_TRANSPORT"] = transport
    return env


def expect_patched_gloo(results, libgloo):
    for res in results:
        assert [os.path.realpath(p) for p in res["libgloo"]] == [libgloo], res["libgloo"]


@pytest.mark.parametrize("transport", ["TCP", "UDP"])
def test_transpose_runs_tar_through_the_hook(run_job, patched_libgloo, transport):
    job = run_job("patched_gloo_worker.py", 2, env_for(patched_libgloo, "transpose", transport),
                  ["--load-after-torch"])
    results = job.results()
    expect_patched_gloo(results, patched_libgloo)
    for res in results:
        ran, stats = res["ran"], res["stats"]
        c = stats["interposer"]
        assert c["calls"] == ran["allreduce"], (c, ran)
        assert c["hook_calls"] == c["calls"], c  # every call came through the hook
        assert c["tar_calls"] == ran["supported"], (c, ran)
        assert c["forwarded_unsupported_type"] == ran["unsupported_type"], c
        assert c["forwarded_unsupported_op"] == ran["unsupported_op"], c
        assert c["errors"] == 0, c
        if transport == "UDP":
            t = stats["transport"]
            assert t["devices"] >= 1 and t["tx_packets"] > 0, t


def test_ring_does_not_call_the_hook(run_job, patched_libgloo):
    job = run_job("patched_gloo_worker.py", 2, env_for(patched_libgloo, "ring"),
                  ["--load-after-torch"])
    results = job.results()
    expect_patched_gloo(results, patched_libgloo)
    for res in results:
        c = res["stats"]["interposer"]
        assert c["calls"] == 0 and c["hook_calls"] == 0, c


def test_ring_needs_no_optireduce(run_job, patched_libgloo):
    # Stock behaviour with the patch applied: GLOO_ALGO unset or ring never looks the hook up.
    for algo in ("ring", None):
        job = run_job("patched_gloo_worker.py", 2, env_for(patched_libgloo, algo))
        expect_patched_gloo(job.results(), patched_libgloo)


def test_transpose_without_optireduce_fails_naming_the_fix(run_job, patched_libgloo):
    job = run_job("patched_gloo_worker.py", 2, env_for(patched_libgloo, "transpose"),
                  expect_ok=False, timeout=150)
    assert job.codes != [0, 0]
    logs = job.all_logs()
    assert "GLOO_ALGO=transpose needs liboptireduce" in logs, logs
