"""`make lab`: the project's kernel (notebooks.register_kernel), the command that starts
JupyterLab (notebooks.lab_command), the kernel every notebook names, and a smoke test of the server:
it starts on 127.0.0.1 with a random port and a token, offers the kernel, serves the notebooks and
the JupyterLab page, and stops."""

from __future__ import annotations

import dataclasses
import json
import sys

import nbformat
import pytest
from labserver import running_lab

from carbonrouter_lib import notebooks

ALL_NOTEBOOKS = sorted(notebooks.NOTEBOOK_DIR.glob("*.ipynb"))


def test_register_kernel_points_at_this_environment(tmp_path):
    where = notebooks.register_kernel(tmp_path)
    assert where == tmp_path / "share" / "jupyter" / "kernels" / notebooks.KERNEL_NAME
    spec = json.loads((where / "kernel.json").read_text())
    # The venv's interpreter as named (a resolved symlink would be the base Python, without the
    # pinned packages).
    assert spec["argv"][0] == sys.executable
    assert spec["argv"][-4:] == ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["display_name"] == notebooks.KERNEL_DISPLAY_NAME
    assert spec["language"] == "python"


def test_lab_command_serves_loopback_on_the_port_with_the_project_kernel(tmp_path):
    cmd = notebooks.lab_command(4321, tmp_path, token="t0k", open_browser=False, extra=["--x=1"])
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in cmd
    assert "--ServerApp.port=4321" in cmd
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in cmd
    assert f"--MappingKernelManager.default_kernel_name={notebooks.KERNEL_NAME}" in cmd
    assert "--IdentityProvider.token=t0k" in cmd and "--ServerApp.open_browser=False" in cmd
    assert cmd[-1] == "--x=1"
    default = notebooks.lab_command()
    assert f"--ServerApp.root_dir={notebooks.NOTEBOOK_DIR.resolve()}" in default
    assert not any(a.startswith("--IdentityProvider.token") for a in default)


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_opens_on_the_project_kernel(path):
    spec = nbformat.read(path, as_version=4).metadata.get("kernelspec", {})
    assert spec.get("name") == notebooks.KERNEL_NAME, (
        f"{path.name}: kernelspec {spec.get('name')!r}; choose the kernel "
        f"'{notebooks.KERNEL_DISPLAY_NAME}' in JupyterLab (make lab) and save")
    assert spec.get("display_name") == notebooks.KERNEL_DISPLAY_NAME


def test_lab_server_starts_offers_the_kernel_and_stops(tmp_path):
    with running_lab(notebooks.NOTEBOOK_DIR, tmp_path) as lab:
        specs = lab.api("kernelspecs")
        assert specs["default"] == notebooks.KERNEL_NAME
        spec = specs["kernelspecs"][notebooks.KERNEL_NAME]["spec"]
        assert spec["argv"][0] == sys.executable
        assert spec["display_name"] == notebooks.KERNEL_DISPLAY_NAME
        # Only the kernel registered for this server: the user's own kernels play no part.
        assert set(specs["kernelspecs"]) <= {notebooks.KERNEL_NAME, "python3"}
        listed = {item["name"] for item in lab.api("contents")["content"]}
        assert {p.name for p in ALL_NOTEBOOKS} <= listed
        status, page = lab.get(f"lab/tree/{ALL_NOTEBOOKS[0].name}")
        assert status == 200 and b"JupyterLab" in page, lab.log_tail()
        # Without the token the server refuses the API.
        assert dataclasses.replace(lab, token="wrong").get("api/kernelspecs")[0] == 403
        process = lab.process
    assert process.poll() is not None, "the server is still running after the block"
