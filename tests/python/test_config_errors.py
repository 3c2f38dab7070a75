"""Misconfiguration fails fast, with a message that names the variable, value and choices."""

import textwrap

import pytest

from conftest import base_env, run_python, torch_lib

ONE_RANK_ALLREDUCE = textwrap.dedent("""
    import os, sys, tempfile
    if "--import" in sys.argv:
        import optireduce
    import torch, torch.distributed as dist
    d = tempfile.mkdtemp()
    try:
        dist.init_process_group("gloo", init_method="file://" + d + "/s", rank=0,
                                world_size=1)
        print("INIT_OK", flush=True)
        t = torch.ones(4)
        dist.all_reduce(t)
        print("ALLREDUCE_OK", flush=True)
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
""")


def run_rank(env, *args):
    code = ONE_RANK_ALLREDUCE.replace('"--import" in sys.argv', str("--import" in args))
    return run_python(code, env)


def test_unknown_algo_on_import():
    p = run_python("import optireduce", base_env(GLOO_ALGO="bcube"))
    assert p.returncode != 0
    assert "ConfigError" in p.stderr
    assert "GLOO_ALGO='bcube' is not valid" in p.stderr
    assert "ring, transpose, optireduce" in p.stderr


def test_unknown_algo_with_ld_preload_fails_at_first_allreduce():
    p = run_rank(base_env(GLOO_ALGO="tar", LD_PRELOAD=torch_lib()))
    assert p.returncode != 0, p.stdout
    assert "INIT_OK" in p.stdout and "ALLREDUCE_OK" not in p.stdout
    assert "GLOO_ALGO='tar' is not valid" in p.stderr, p.stderr


def test_bad_value_fails_at_device_creation():
    p = run_rank(base_env(GLOO_DEVICE_TRANSPORT="UDP", OPTIREDUCE_UDP_PORT_BASE="70000",
                          LD_PRELOAD=torch_lib()))
    assert p.returncode != 0
    assert "INIT_OK" not in p.stdout
    assert "OPTIREDUCE_UDP_PORT_BASE='70000' is not valid" in p.stderr, p.stderr


@pytest.mark.parametrize("name,value,expect", [
    ("OPTIREDUCE_HADAMARD", "maybe", "OPTIREDUCE_HADAMARD='maybe' is not valid"),
    ("OPTIREDUCE_MAX_LOSS", "2", "OPTIREDUCE_MAX_LOSS='2' is not valid"),
    ("OPTIREDUCE_LAYOUT", "2d", "OPTIREDUCE_LAYOUT='2d' is not valid"),
    ("OPTIREDUCE_REPAIR_BUDGET", "-1", "OPTIREDUCE_REPAIR_BUDGET='-1' is not valid"),
    ("GLOO_DPDK_TIMEOUT", "-5", "GLOO_DPDK_TIMEOUT='-5' is not valid"),
    ("OPTIREDUCE_FAULTS", "drop=lots", "OPTIREDUCE_FAULTS='drop=lots' is not valid"),
])
def test_bad_optireduce_values_on_import(name, value, expect):
    p = run_python("import optireduce", base_env(**{name: value}))
    assert p.returncode != 0
    assert expect in p.stderr, p.stderr


def test_import_after_torch_is_refused():
    p = run_python("import torch\nimport optireduce", base_env())
    assert p.returncode != 0
    assert "ImportError" in p.stderr
    assert "must come before `import torch`" in p.stderr


def test_import_after_torch_is_fine_with_ld_preload():
    # The preloaded copy is used (no second copy, whose c10d registration would kill the
    # process), and the counters are the live ones.
    code = textwrap.dedent("""
        import torch
        import optireduce
        assert optireduce.is_interposed()
        print(optireduce.library_path())
    """)
    p = run_python(code, base_env(LD_PRELOAD=torch_lib()))
    assert p.returncode == 0, p.stderr
    assert "already loaded" in p.stdout


def test_two_copies_of_the_library_do_not_kill_the_process(tmp_path):
    # LD_PRELOAD of one file and `import optireduce` of another copy: the second copy's
    # device registration must be skipped (c10's registry exits on duplicates).
    copy = tmp_path / "liboptireduce_torch_copy.so"
    copy.write_bytes(open(torch_lib(), "rb").read())
    code = textwrap.dedent(f"""
        import ctypes, os
        second = ctypes.CDLL({str(copy)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        first = ctypes.CDLL(None)
        import torch
        # UDP and DPDK (bits 1, 2) were registered by the preloaded copy only.
        print("ALIVE", first.optireduce_torch_devices_registered(),
              second.optireduce_torch_devices_registered())
    """)
    p = run_python(code, base_env(LD_PRELOAD=torch_lib()))
    assert p.returncode == 0, p.stderr
    assert "ALIVE 3 0" in p.stdout, p.stdout


def test_unknown_optireduce_variable_warns_once():
    p = run_python("import optireduce; optireduce.config(); optireduce.config()",
                   base_env(OPTIREDUCE_HADAMRD="1"))
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("unknown environment variable(s) OPTIREDUCE_HADAMRD") == 1


def test_unknown_device_transport_name():
    p = run_rank(base_env(GLOO_DEVICE_TRANSPORT="UDPP", LD_PRELOAD=torch_lib()))
    assert p.returncode != 0
    assert "INIT_OK" not in p.stdout


def test_dpdk_without_backend_or_eal_args_fails_with_message():
    env = base_env(GLOO_DEVICE_TRANSPORT="DPDK", LD_PRELOAD=torch_lib(),
                   OPTIREDUCE_EAL_ARGS="--this-is-not-an-eal-flag")
    p = run_rank(env)
    assert p.returncode != 0
    assert "INIT_OK" not in p.stdout
    assert "GLOO_DEVICE_TRANSPORT=DPDK" in p.stderr, p.stderr
    have = run_python("import optireduce; print(optireduce.have_dpdk())", base_env())
    if have.stdout.strip() == "True":
        assert "EAL" in p.stderr or "eal" in p.stderr, p.stderr
    else:
        assert "no DPDK device" in p.stderr, p.stderr


def test_stats_file_is_written_at_exit(tmp_path):
    path = tmp_path / "stats-%p.json"
    p = run_rank(base_env(GLOO_ALGO="transpose", LD_PRELOAD=torch_lib(),
                          OPTIREDUCE_STATS_FILE=str(path)))
    assert p.returncode == 0, p.stderr
    files = list(tmp_path.glob("stats-*.json"))
    assert len(files) == 1 and "%p" not in files[0].name, files
    import json
    stats = json.loads(files[0].read_text())
    assert stats["interposer"]["calls"] == 1, stats
    assert stats["interposer"]["tar_calls"] == 1, stats
