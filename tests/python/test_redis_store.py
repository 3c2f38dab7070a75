"""optireduce.RedisStore against a real redis-server (password, free port)."""

import textwrap

from conftest import base_env, run_python

API_CHECKS = textwrap.dedent("""
    import datetime, time
    import optireduce
    import torch.distributed as dist
    s = optireduce.RedisStore(URL, job_id="api", world_size=1,
                              timeout=datetime.timedelta(seconds=2))
    assert isinstance(s, dist.Store)
    s.set("a", b"\\x00bin\\xff")
    assert s.get("a") == b"\\x00bin\\xff"
    s.set("t", "text")
    assert s.get("t") == b"text"
    assert s.add("n", 5) == 5 and s.add("n", -2) == 3
    assert s.get("n") == b"3"
    # compare_set: missing key + empty expected sets; mismatch returns the current value.
    assert s.compare_set("c", "", "one") == b"one"
    assert s.compare_set("c", "zzz", "two") == b"one"
    assert s.compare_set("c", "one", "two") == b"two"
    assert s.check(["a", "t"]) and not s.check(["a", "missing"])
    assert s.num_keys() >= 4
    assert s.delete_key("t") is True and s.delete_key("t") is False
    start = time.monotonic()
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        raise SystemExit("wait did not time out")
    except optireduce.StoreTimeoutError as e:
        assert "never" in str(e), e
    assert time.monotonic() - start < 10
    try:
        s.get("missing")  # the store timeout (2 s)
        raise SystemExit("get did not time out")
    except optireduce.StoreTimeoutError:
        pass
    s.close()
    try:
        optireduce.RedisStore(BAD_URL, job_id="api", world_size=1)
        raise SystemExit("wrong password accepted")
    except RuntimeError as e:
        assert "optireduce.RedisStore" in str(e)
        assert "wrong-pw" not in str(e), e
    print("API_OK")
""")


def test_store_api_semantics(redis_server):
    code = API_CHECKS.replace("BAD_URL", repr(f"redis://:wrong-pw@127.0.0.1:{redis_server.port}"))
    code = code.replace("URL", repr(redis_server.url))
    p = run_python(code, base_env())
    assert p.returncode == 0, p.stderr
    assert "API_OK" in p.stdout


def test_init_process_group_over_redis(run_job, redis_server):
    env = base_env(OPTIREDUCE_REDIS_URL=redis_server.url, TEST_JOB_ID="pg-test",
                   GLOO_ALGO="transpose")
    job = run_job("redis_store_worker.py", 2, env, timeout=180)
    for res in job.results():
        assert res["seen"] == ["hello 0", "hello 1"]
        assert res["total"] == 3
        assert res["stats"]["interposer"]["tar_calls"] >= 1
    # Both ranks closed: the last one deleted the run's keys.
    p = run_python(textwrap.dedent(f"""
        import redis
        r = redis.Redis(host="127.0.0.1", port={redis_server.port}, password={redis_server.PASSWORD!r})
        print(sorted(k.decode() for k in r.keys("optireduce/pg-test/*")))
    """), base_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
