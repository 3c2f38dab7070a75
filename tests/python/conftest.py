"""Shared fixtures for the optireduce Python tests.

Tests run real processes: each rank is `/usr/bin/python3 <worker>` started with its own
environment (LD_PRELOAD or `import optireduce`, GLOO_ALGO, GLOO_DEVICE_TRANSPORT, ...), and
every process is killed and reaped when a test ends, also on failure or timeout.

Environment (set by ctest; defaults work from a build in <repo>/build):
  OPTIREDUCE_TORCH_LIB   path of the built liboptireduce_torch.so
  PYTHONPATH             must contain <repo>/gloo_ext/python
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(REPO, "gloo_ext", "python")
PYTHON = "/usr/bin/python3"


def torch_lib():
    path = os.environ.get("OPTIREDUCE_TORCH_LIB",
                          os.path.join(REPO, "build", "gloo_ext", "liboptireduce_torch.so"))
    if not os.path.isfile(path):
        pytest.fail(f"liboptireduce_torch.so not found at {path}; build target "
                    f"optireduce_torch or set OPTIREDUCE_TORCH_LIB")
    return path


def base_env(**overrides):
    """A clean environment for a rank: no inherited GLOO_/OPTIREDUCE_ settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GLOO_", "OPTIREDUCE_")) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = PACKAGE_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["OPTIREDUCE_TORCH_LIB"] = torch_lib()
    env["OMP_NUM_THREADS"] = "1"  # 2 cores shared by up to 4 ranks
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """world_size processes of `script`; each gets RANK WORLD INIT OUT_JSON + args."""

    def __init__(self, script, world, env, args=(), timeout=240):
        self.dir = tempfile.mkdtemp(prefix="optireduce-pytest-")
        self.world = world
        self.procs = []
        self.logs = []
        self.outs = [os.path.join(self.dir, f"out{r}.json") for r in range(world)]
        init = "file://" + os.path.join(self.dir, "store")
        self.deadline = time.monotonic() + timeout
        for r in range(world):
            log = open(os.path.join(self.dir, f"log{r}.txt"), "w+")
            self.logs.append(log)
            # env: one dict for all ranks, or a function rank -> dict (per-rank settings).
            rank_env = env(r, self.dir) if callable(env) else env
            self.procs.append(subprocess.Popen(
                [PYTHON, os.path.join(HERE, script), str(r), str(world), init, self.outs[r],
                 *args],
                env=rank_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait(self):
        """Exit codes of all ranks (kills everything at the deadline)."""
        codes = []
        for p in self.procs:
            left = max(0.1, self.deadline - time.monotonic())
            try:
                codes.append(p.wait(timeout=left))
            except subprocess.TimeoutExpired:
                self.kill()
                codes.append(p.wait())
        return codes

    def log(self, r):
        self.logs[r].flush()
        self.logs[r].seek(0)
        return self.logs[r].read()

    def all_logs(self):
        return "\n".join(f"--- rank {r} ---\n{self.log(r)[-4000:]}" for r in range(self.world))

    def results(self):
        out = []
        for path in self.outs:
            with open(path) as f:
                out.append(json.load(f))
        return out

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def close(self):
        self.kill()
        for log in self.logs:
            log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture
def run_job():
    """run_job(script, world, env, args=(), expect_ok=True) -> Job (results() available)."""
    jobs = []

    def run(script, world, env, args=(), expect_ok=True, timeout=240):
        job = Job(script, world, env, args, timeout)
        jobs.append(job)
        codes = job.wait()
        if expect_ok:
            assert codes == [0] * world, f"exit codes {codes}\n{job.all_logs()}"
        job.codes = codes
        return job

    yield run
    for job in jobs:
        job.close()


def run_python(code, env, timeout=120):
    """Runs `code` in a fresh /usr/bin/python3; returns CompletedProcess (text)."""
    return subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def have_dpdk():
    p = run_python("import optireduce; print(optireduce.have_dpdk())", base_env())
    return p.returncode == 0 and p.stdout.strip() == "True"


def memif_mesh_eal(rank, size, job_dir):
    """EAL arguments of `rank`: one memif link per peer (the lower rank of a pair serves
    its socket), no hugepages — as transport::dpdk::MemifMeshEalArgs."""
    vdevs = []
    for peer in range(size):
        if peer == rank:
            continue
        lo, hi = min(rank, peer), max(rank, peer)
        role = "server" if rank == lo else "client"
        vdevs.append(f"--vdev=net_memif{len(vdevs)},role={role},id=0,"
                     f"socket={job_dir}/{lo}-{hi}.sock,socket-abstract=no")
    return ("--no-huge --no-shconf -m 512 --no-pci --no-telemetry --log-level=*:warning "
            + " ".join(vdevs))


class RedisServer:
    """A real redis-server on a free loopback port with a password and no persistence."""

    PASSWORD = "py-s3cret-pw"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="optireduce-redis-")
        last = None
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--requirepass", self.PASSWORD, "--save", "", "--appendonly", "no",
                 "--dir", self.dir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_ready():
                return
            last = self.proc.poll()
            self.stop()
        raise RuntimeError(f"redis-server did not start (last exit {last})")

    def _wait_ready(self):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(f"AUTH {self.PASSWORD}\r\nPING\r\n".encode())
                    data = b""
                    while b"PONG" not in data:
                        chunk = s.recv(100)
                        if not chunk:
                            break
                        data += chunk
                    if b"PONG" in data:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    @property
    def url(self):
        return f"redis://:{self.PASSWORD}@127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self):
        self.stop()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture
def redis_server():
    server = RedisServer()
    yield server
    server.close()
