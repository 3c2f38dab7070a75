"""torch.distributed point-to-point calls and monitored_barrier: the same job over Gloo's TCP
transport and over optireduce's UDP transport, 2 and 4 real processes; every rank's outcome
(values and sources, or the exception and the ranks it names) and exit code must match.
p2p_worker.py lists the scenarios: recv/irecv without src, isend, a ring of irecv/isend,
batch_isend_irecv with tags, monitored_barrier with and without wait_all_ranks, and with
ranks that never arrive (rank 0 times out and names them, the others raise)."""

import pytest

from conftest import base_env


def outcome(run_job, transport, world):
    env = base_env()
    if transport != "TCP":
        env["GLOO_DEVICE_TRANSPORT"] = transport
    job = run_job("p2p_worker.py", world, env, expect_ok=False, timeout=180)
    assert job.codes == [0] * world, f"{transport}: exit codes {job.codes}\n{job.all_logs()}"
    seen = []
    for res in job.results():
        # The wording differs between transports; compare without it.
        seen.append({name: [{k: v for k, v in s.items() if k != "message"}
                            if isinstance(s, dict) else s for s in got]
                     for name, got in res["seen"].items()})
    return seen, job


@pytest.mark.parametrize("world", [2, 4])
def test_same_outcome_as_tcp(run_job, world):
    tcp, tcp_job = outcome(run_job, "TCP", world)
    udp, udp_job = outcome(run_job, "UDP", world)
    for r in range(world):
        for name in tcp[r]:
            assert udp[r].get(name) == tcp[r][name], (
                f"rank {r} {name}: UDP {udp[r].get(name)} TCP {tcp[r][name]}\n"
                f"TCP:\n{tcp_job.all_logs()}\nUDP:\n{udp_job.all_logs()}")
    # What torch promises, so both transports being wrong the same way fails too.
    assert tcp[0]["p2p"][0] == ["recv_any", [[r, 100.0 * (r + 1)] for r in range(1, world)]]
    for name in ("barrier", "barrier_wait_all"):
        assert all(seen[name] == [["passed"]] for seen in tcp), tcp
    for name in ("barrier_missing", "barrier_missing_wait_all"):
        assert any("raised" in s for seen in tcp for s in seen[name] if isinstance(s, dict)), tcp
