"""A JupyterLab server for the tests, started as ``make lab`` starts it.

:func:`running_lab` registers the project's kernel into a temporary prefix, starts
:func:`carbonrouter_lib.notebooks.lab_command` on a free port of 127.0.0.1 with a random token and
Jupyter folders of its own (the user's kernels, settings and workspaces play no part), waits until
it answers, and always stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carbonrouter_lib import notebooks

#: How long the server may take to answer (s): JupyterLab starts in ~5 s on an idle core.
START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Lab:
    """A running server: its base URL, token, log file and process."""

    url: str
    token: str
    log: Path
    process: subprocess.Popen

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """HTTP status and body of ``GET <url>/<path>`` with the token."""
        req = urllib.request.Request(f"{self.url}/{path.lstrip('/')}",
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def api(self, path: str) -> Any:
        """The JSON of ``GET <url>/api/<path>`` (status 200 required)."""
        status, body = self.get(f"api/{path}")
        assert status == 200, f"GET /api/{path}: HTTP {status}: {body[:300]!r}"
        return json.loads(body)

    def log_tail(self, n: int = 4000) -> str:
        """The end of the server's log, for failure messages."""
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else "(no log)"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_lab(root_dir: Path, tmp: Path, timeout_s: float = START_TIMEOUT_S) -> Iterator[Lab]:
    """JupyterLab serving ``root_dir`` with the ``carbonrouter`` kernel registered under ``tmp``
    (its folders go there too); stopped on exit, however the block ends."""
    prefix = tmp / "prefix"
    notebooks.register_kernel(prefix)
    env = {**os.environ,
           "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
           "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces")}
    # No "notified about Jupyter news?" toast over the notebook, no update check (no network).
    notification = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = free_port(), secrets.token_hex(16)
    cmd = notebooks.lab_command(
        port, root_dir, token=token, open_browser=False,
        extra=["--ServerApp.port_retries=0",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"])
    log = tmp / "lab.log"
    with open(log, "wb") as out:
        # Its own session, so that the fallback below can stop the server with what it started.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=root_dir, start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, log, proc)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{lab.log_tail()}")
            with contextlib.suppress(OSError):
                if lab.get("api/status", timeout_s=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n"
                                   f"{lab.log_tail()}")
            time.sleep(0.25)
        yield lab
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop the server: SIGTERM (it shuts its kernels down), then SIGKILL of its process group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
