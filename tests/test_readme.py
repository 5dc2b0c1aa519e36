"""Every Python block of the README runs as written (a fresh interpreter per block, in the
repository, as a script: so a block that starts Dask needs its ``__main__`` guard). A block whose
first line is ``# needs: make serve`` runs against the embedded demo (``python -m
carbonrouter_lib.serve demo``), started here on 127.0.0.1 and stopped after it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
SERVE_MARK = "# needs: make serve"


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.fixture(scope="module")
def demo_server():
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "carbonrouter_lib.serve", "demo", "--port",
                             "8000"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the demo exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get("http://127.0.0.1:8000/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise TimeoutError("the demo did not answer /healthz within 120 s")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs_as_written(index, tmp_path, request):
    code = BLOCKS[index]
    if code.startswith(SERVE_MARK):
        request.getfixturevalue("demo_server")
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(code)
    env = dict(os.environ, MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, (f"README Python block {index} failed:\n{code}\n"
                                  f"--- stderr ---\n{done.stderr[-4000:]}")
