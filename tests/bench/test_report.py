"""bench/report.sh --quick (bench/report.py): regenerates the results page and its folders,
each section with its command, machine and date; a rerun replaces a section whole."""
import csv
import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REPORT = os.path.join(REPO, "bench", "report.py")


def sweep_bin(bench_bin):
    return os.environ.get("OPTIREDUCE_BENCH_SWEEP_BIN",
                          os.path.join(os.path.dirname(bench_bin), "optireduce-sweep"))


def tool_args(bench_bin):
    """The tools report.py runs, next to optireduce-bench unless the environment names them."""
    here = os.path.dirname(bench_bin)
    return ["--bench-bin", bench_bin, "--sweep-bin", sweep_bin(bench_bin),
            "--latency-bin", os.environ.get("OPTIREDUCE_BENCH_LATENCY_BIN",
                                            os.path.join(here, "latency_bench")),
            "--peer-death-bin", os.environ.get("OPTIREDUCE_BENCH_PEER_DEATH_BIN",
                                               os.path.join(here, "peer_death_bench"))]


def test_quick_report_regenerates_the_page(bench_bin, tmp_path):
    results, page = tmp_path / "results", tmp_path / "RESULTS.md"
    stale = results / "demo" / "old_run.csv"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale\n")
    p = subprocess.run([sys.executable, REPORT, "--quick"] + tool_args(bench_bin) +
                       ["--page", str(page), "--results", str(results)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    text = page.read_text()
    assert not stale.exists()
    root = os.geteuid() == 0
    for title in ("The main job", "Message sizes", "Packet loss", "Stragglers",
                  "Small messages and setup", "A peer dies", "Scaling: ring, flat and 2D TAR",
                  "Incast at the owner", "Time to accuracy"):
        assert "## " + title in text, text
    # Every generated table says how it was made.
    made = re.findall(r"Command: `[^`]+`  \nMachine: \d+ CPUs.*, Linux \S+, load average "
                      r"[\d.]+/[\d.]+/[\d.]+; made "
                      r"\d{4}-\d\d-\d\d \d\d:\d\d UTC\.", text)
    assert len(made) == (7 if root else 4), text
    assert "Gloo ring_chunked, Gloo TCP" in text and "transpose@udp" in text, text
    assert (results / "demo" / "cdf.png").stat().st_size > 0
    assert (results / "sweep" / "sweep.png").stat().st_size > 0
    with open(results / "sweep" / "sweep.csv") as f:
        assert {r["transport"] for r in csv.DictReader(f)} >= {"tcp", "udp"}
    with open(results / "latency" / "latency.csv") as f:
        assert {r["transport"] for r in csv.DictReader(f)} >= {"tcp", "udp"}
    with open(results / "failure" / "peer_death.csv") as f:
        deaths = list(csv.DictReader(f))
    assert {r["device"] for r in deaths} >= {"tcp", "udp"}, deaths
    assert "| udp | SIGKILL |" in text, text
    if root:
        assert (results / "loss" / "p99_vs_loss.png").stat().st_size > 0
        with open(results / "loss" / "loss.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 15 and {r["loss"] for r in rows} == {"0.0", "0.001", "0.01", "0.05"}
        assert {(r["loss"], r["pattern"]) for r in rows} == {
            ("0.0", "random"), ("0.001", "random"), ("0.01", "random"), ("0.01", "burst:8"),
            ("0.05", "acks")}, rows
        # Every row counts its needless resends (the loss table's "spurious resends").
        assert all(r["spurious_pkts"].isdigit() for r in rows), rows
        assert "| resent / dropped | spurious resends |" in text, text
        assert (results / "straggler" / "lab" / "cdf.png").stat().st_size > 0
        with open(results / "incast" / "incast.csv") as f:
            rows = list(csv.DictReader(f))
        assert {(r["algo"], r["layout"], r["link"]) for r in rows} == {
            (algo, layout, link) for algo in ("transpose", "optireduce")
            for layout in ("flat", "2d") for link in ("open", "2gbit/1mb")}, rows
        assert all(r["status"] in ("ok", "not built") for r in rows), rows
        assert all(r["owner_rcvbuf_errors"].isdigit() for r in rows if r["status"] == "ok")
    else:
        assert "needs root" in text
    # The scaling section: measured points, fitted costs, ratios, predictions to 1 024.
    with open(results / "scaling" / "check.csv") as f:
        assert {r["algo"] for r in csv.DictReader(f)} >= {"ring", "flat"}
    with open(results / "scaling" / "predictions.csv") as f:
        assert {int(r["ranks"]) for r in csv.DictReader(f)} >= {64, 256, 1024}
    assert "| algorithm | a µs | b' ns/B | k µs |" in text, text
    # The images and CSVs the page links to exist.
    for link in re.findall(r"\]\(([^)]+\.(?:png|csv))\)", text):
        assert (tmp_path / link).exists(), link
    assert sorted(os.listdir(results)) == sorted(
        ["demo", "sweep", "loss", "straggler", "latency", "failure", "scaling", "incast"]), \
        os.listdir(results)


def test_unknown_section_is_named(bench_bin, tmp_path):
    p = subprocess.run([sys.executable, REPORT, "--only", "demo,bogus"] + tool_args(bench_bin) +
                       ["--page", str(tmp_path / "R.md"), "--results", str(tmp_path / "r")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2 and "--only: unknown section 'bogus'" in p.stderr, p.stderr
    assert not (tmp_path / "r").exists()


def test_sweep_tar_chunk_pipelines_exact_tar_and_names_a_bad_size(bench_bin):
    """optireduce-sweep --tar-chunk: exact TAR unpipelined (0) and in chunks that divide no
    shard, verified; a size below one element is refused naming the flag."""
    sweep = sweep_bin(bench_bin)
    for chunk in ["0", "12K"]:
        p = subprocess.run([sweep, "--ranks", "3", "--sizes", "256K", "--iters", "3",
                            "--tar-chunk", chunk, "--algos", "transpose_tar@tcp"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        rows = [l for l in p.stdout.splitlines() if "transpose_tar@tcp" in l]
        assert rows and rows[0].split()[-1] == "exact", p.stdout
    p = subprocess.run([sweep, "--tar-chunk", "2"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30)
    assert p.returncode == 2 and "--tar-chunk" in p.stderr, p.stderr


def test_sweep_repeat_reports_the_median_of_interleaved_runs_and_names_a_bad_count(bench_bin, tmp_path):
    """optireduce-sweep --repeat 2: every algorithm runs twice, interleaved; one verified row
    per size and algorithm, its CSV row saying 2 runs; 0 runs are refused naming the flag."""
    sweep = sweep_bin(bench_bin)
    out = tmp_path / "rep.csv"
    p = subprocess.run([sweep, "--ranks", "2", "--sizes", "4K", "--iters", "3", "--repeat", "2",
                        "--algos", "ring_chunked@tcp,transpose@tcp", "--csv", str(out)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("(run 2 of 2)") == 2, p.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [(r["algorithm"], r["runs"], r["verified"]) for r in rows] == \
        [("ring_chunked", "2", "1"), ("transpose", "2", "1")], rows
    p = subprocess.run([sweep, "--repeat", "0"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30)
    assert p.returncode == 2 and "--repeat" in p.stderr, p.stderr
