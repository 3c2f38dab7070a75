import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def bench_bin():
    path = os.environ.get("OPTIREDUCE_BENCH_BIN",
                          os.path.join(REPO, "build", "bench", "optireduce-bench"))
    if not os.access(path, os.X_OK):
        pytest.skip("optireduce-bench not built at %s (set OPTIREDUCE_BENCH_BIN)" % path)
    return path
