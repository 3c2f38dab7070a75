"""The Python package and the Debian package as a user gets them (README "Using it"):
`import optireduce` in a fresh /usr/bin/python3 from the build tree (PYTHONPATH=build/python)
and from a `cmake --install` prefix; `cpack -G DEB` packs the library, the torch plug-in,
the Python package, the CMake config and the benchmark tools, and the extracted tree runs.

Environment: OPTIREDUCE_BUILD_DIR (the build tree under test)."""
import os
import shutil
import subprocess
import sys

import pytest

BUILD = os.path.abspath(os.environ.get("OPTIREDUCE_BUILD_DIR", "build"))
PY = "/usr/bin/python3"
CHECK = ("import optireduce, json; print(json.dumps({'lib': optireduce.library_path(), "
         "'version': optireduce.__version__, 'algo': optireduce.config()['algo']}))")


def clean_env(**extra):
    # A fresh shell: nothing of ours on the path, no library override.
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(extra)
    return env


def python(code, cwd, **env):
    return subprocess.run([PY, "-c", code], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120, env=clean_env(**env))


def loaded(p):
    import json
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_from_the_build_tree(tmp_path):
    got = loaded(python(CHECK, tmp_path, PYTHONPATH=os.path.join(BUILD, "python"),
                        GLOO_ALGO="transpose"))
    assert got["lib"] == os.path.join(BUILD, "python", "optireduce", "liboptireduce_torch.so")
    assert os.path.realpath(got["lib"]) == os.path.join(BUILD, "gloo_ext",
                                                        "liboptireduce_torch.so")
    assert got["algo"] == "transpose"


def test_import_without_the_path_step_fails_clearly(tmp_path):
    p = python("import optireduce", tmp_path)
    assert p.returncode != 0 and "No module named 'optireduce'" in p.stderr


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix")
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(d)], check=True,
                   stdout=subprocess.DEVNULL)
    return d


def test_import_from_an_install_prefix(prefix, tmp_path):
    ver = "%d.%d" % sys.version_info[:2] if sys.executable == PY else subprocess.run(
        [PY, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        stdout=subprocess.PIPE, text=True).stdout.strip()
    site = prefix / "lib" / ("python%s" % ver) / "site-packages"
    assert (site / "optireduce" / "_install_paths.py").exists()
    got = loaded(python(CHECK, tmp_path, PYTHONPATH=str(site)))
    assert got["lib"] == str(prefix / "lib" / "liboptireduce_torch.so")


def test_install_to_usr_local_uses_debians_dist_packages(tmp_path):
    # The default prefix: where /usr/bin/python3 looks (DESTDIR stands in for the root).
    subprocess.run(["cmake", "--install", BUILD, "--prefix", "/usr/local"], check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, DESTDIR=str(tmp_path)))
    ver = subprocess.run([PY, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         stdout=subprocess.PIPE, text=True).stdout.strip()
    pkg = tmp_path / "usr/local/lib" / ("python%s" % ver) / "dist-packages" / "optireduce"
    assert (pkg / "__init__.py").exists()
    assert "'/usr/local/lib/liboptireduce_torch.so'" in (pkg / "_install_paths.py").read_text()
    on_path = subprocess.run([PY, "-c", "import sys; print('\\n'.join(sys.path))"],
                             stdout=subprocess.PIPE, text=True, env=clean_env()).stdout.split()
    assert "/usr/local/lib/python%s/dist-packages" % ver in on_path


def test_installed_bench_tool_runs(prefix):
    p = subprocess.run([str(prefix / "bin" / "optireduce-bench"), "--local-ranks", "2",
                        "--elements", "1000", "--iteration-count", "3", "transpose"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                       env=clean_env())
    assert p.returncode == 0, p.stderr
    assert any(l.split()[:2] == ["4000", "1000"] for l in p.stdout.splitlines()), p.stdout


def test_deb_contents_and_extracted_tree_runs(tmp_path):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed")
    out = tmp_path / "pkg"
    p = subprocess.run(["cpack", "-G", "DEB", "--config", os.path.join(BUILD, "CPackConfig.cmake"),
                        "-B", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300, cwd=BUILD)
    assert p.returncode == 0, p.stdout
    (deb,) = [f for f in os.listdir(out) if f.endswith(".deb")]
    deb = str(out / deb)
    files = subprocess.run(["dpkg-deb", "-c", deb], stdout=subprocess.PIPE, text=True,
                           check=True).stdout
    for want in ("./usr/lib/liboptireduce.so.0", "./usr/lib/liboptireduce_torch.so",
                 "./usr/lib/python3/dist-packages/optireduce/__init__.py",
                 "./usr/lib/python3/dist-packages/optireduce/_install_paths.py",
                 "./usr/lib/cmake/optireduce/optireduceConfig.cmake",
                 "./usr/include/optireduce/algorithms/allreduce.h",
                 "./usr/bin/optireduce-bench", "./usr/bin/optireduce-sweep"):
        assert want in files, want
    control = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], stdout=subprocess.PIPE,
                             text=True, check=True).stdout
    assert "python3-torch" in control and "libgloo0" in control, control
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    assert "'/usr/lib/liboptireduce_torch.so'" in (
        root / "usr/lib/python3/dist-packages/optireduce/_install_paths.py").read_text()
    # The extracted tree stands in for /usr: the loader finds its libraries there.
    lib = str(root / "usr" / "lib")
    got = loaded(python(CHECK, tmp_path, PYTHONPATH=str(root / "usr/lib/python3/dist-packages"),
                        LD_LIBRARY_PATH=lib))
    assert got["lib"] == "liboptireduce_torch.so" and got["version"]
    p = subprocess.run([str(root / "usr/bin/optireduce-sweep"), "--ranks", "2", "--sizes", "4K",
                        "--iters", "3", "--algos", "ring_chunked,transpose@udp"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                       env=clean_env(LD_LIBRARY_PATH=lib))
    assert p.returncode == 0, p.stderr
    assert "transpose@udp" in p.stdout and "exact" in p.stdout, p.stdout
