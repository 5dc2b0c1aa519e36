"""The cache helper: content-derived keys, code hashes, atomic writes, the check on read — alone
and through the modules that use it (carbon signal, prepared workload, sweep results)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import cache, carbon, prepared, sweep
from carbonrouter_lib.cache import CacheWarning
from carbonrouter_lib.carbon import CarbonConfig, CarbonSignal
from carbonrouter_lib.datasets import DataUnavailableError
from carbonrouter_lib.simulator import SimulationConfig
from carbonrouter_lib.sweep import RunSpec

REPO = Path(__file__).resolve().parents[1]
FRAME = pd.DataFrame({"x": np.arange(50, dtype=float), "y": np.arange(50) % 7})


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


# --- keys and code hashes -------------------------------------------------------------------


def test_key_is_canonical_json_of_the_parameters():
    a = cache.key("k", {"a": 1, "b": [1.5, "x"], "c": {"d": None, "e": np.int64(3)}},
                  "carbonrouter_lib.carbon")
    b = cache.key("k", {"c": {"e": 3, "d": None}, "b": (1.5, "x"), "a": 1},
                  "carbonrouter_lib.carbon")
    assert a == b and re.fullmatch(r"[0-9a-f]{64}", a)
    assert cache.key("k", {"a": 2}, "carbonrouter_lib.carbon") != cache.key(
        "k", {"a": 1}, "carbonrouter_lib.carbon")
    assert cache.key("other", {"a": 1}, "carbonrouter_lib.carbon") != cache.key(
        "k", {"a": 1}, "carbonrouter_lib.carbon")
    with pytest.raises(TypeError, match="not JSON-serializable"):
        cache.key("k", {"f": object()}, "carbonrouter_lib.carbon")


def test_dependencies_follow_imports_inside_the_package():
    sweep_deps = cache.dependencies("carbonrouter_lib.sweep")
    for module in ("simulator", "backend", "policies.base", "cost", "metrics", "prepared",
                   "gate", "carbon", "cache"):
        assert f"carbonrouter_lib.{module}" in sweep_deps
    # explore and notebooks use the sweep, not the other way round: editing them reruns nothing.
    assert "carbonrouter_lib.explore" not in sweep_deps
    assert "carbonrouter_lib.notebooks" not in sweep_deps
    carbon_deps = cache.dependencies("carbonrouter_lib.carbon")
    assert "carbonrouter_lib.simulator" not in carbon_deps
    assert "carbonrouter_lib.datasets" in carbon_deps  # imported inside a function
    with pytest.raises(ValueError, match="not a module of carbonrouter_lib"):
        cache.dependencies("pandas")


def test_code_hash_changes_with_the_source_of_a_dependency_only(tmp_path, monkeypatch):
    pkg = tmp_path / "carbonrouter_lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    return 1\n")
    (pkg / "a.py").write_text("import numpy\n\ndef g():\n    from carbonrouter_lib import sub\n")
    (pkg / "c.py").write_text("X = 1\n")
    monkeypatch.setattr(cache, "_PACKAGE_DIR", pkg)

    def fresh_hash(module):
        for f in (cache.code_hash, cache.dependencies, cache._imports):
            f.cache_clear()
        return cache.code_hash(module)

    try:
        assert cache.dependencies("carbonrouter_lib.a") == (
            "carbonrouter_lib", "carbonrouter_lib.a", "carbonrouter_lib.sub",
            "carbonrouter_lib.sub.b")
        before = fresh_hash("carbonrouter_lib.a")
        (pkg / "c.py").write_text("X = 2\n")  # not imported by a
        assert fresh_hash("carbonrouter_lib.a") == before
        (pkg / "sub" / "b.py").write_text("def f():\n    return 2\n")  # imported, relatively
        assert fresh_hash("carbonrouter_lib.a") != before
    finally:
        monkeypatch.undo()
        for f in (cache.code_hash, cache.dependencies, cache._imports):
            f.cache_clear()


def test_a_new_code_hash_makes_new_keys(monkeypatch):
    wl = prepared.WorkloadConfig(dataset="mooncake", max_conversations=40)
    spec = RunSpec.make(wl, SimulationConfig(), "faircarbon")
    cfg = CarbonConfig()
    before = (wl.key(), spec.key(), carbon._cache_entry(cfg, cfg.source_names()).key)
    real = cache.code_hash
    monkeypatch.setattr(cache, "code_hash", lambda *modules: real(*modules) + "-edited")
    after = (wl.key(), spec.key(), carbon._cache_entry(cfg, cfg.source_names()).key)
    assert all(a != b for a, b in zip(before, after, strict=True))


def test_keys_are_the_same_in_another_process():
    code = (
        "from carbonrouter_lib import carbon, prepared\n"
        "from carbonrouter_lib.carbon import CarbonConfig\n"
        "from carbonrouter_lib.simulator import SimulationConfig\n"
        "from carbonrouter_lib.sweep import RunSpec\n"
        "wl = prepared.WorkloadConfig(dataset='mooncake', max_conversations=40)\n"
        "cfg = CarbonConfig()\n"
        "print(wl.key(), RunSpec.make(wl, SimulationConfig(), 'carbonrouter').key(),\n"
        "      carbon._cache_entry(cfg, cfg.source_names()).key)\n"
    )
    wl = prepared.WorkloadConfig(dataset="mooncake", max_conversations=40)
    cfg = CarbonConfig()
    here = [wl.key(), RunSpec.make(wl, SimulationConfig(), "carbonrouter").key(),
            carbon._cache_entry(cfg, cfg.source_names()).key]
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"  # str hashes differ from ours
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == here


# --- entries: atomic writes and the check on read --------------------------------------------


def _entry(tmp_path, fmt="parquet"):
    return cache.entry("t", {"n": 50}, "carbonrouter_lib.cache", folder=tmp_path, fmt=fmt)


@pytest.mark.parametrize("fmt,value", [("parquet", FRAME), ("json", {"a": [1, 2.5, None]}),
                                       ("joblib", {"a": np.arange(3)})])
def test_round_trip_and_layout(tmp_path, fmt, value, no_warnings):
    e = _entry(tmp_path, fmt)
    assert e.load() is None and not e.is_complete()
    e.save(value, meta={"note": "hi"})
    got, meta = e.load()
    if fmt == "parquet":
        pd.testing.assert_frame_equal(got, value)
    elif fmt == "joblib":
        np.testing.assert_array_equal(got["a"], value["a"])
    else:
        assert got == value
    assert meta == {"note": "hi"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"t-{e.key[:20]}.{fmt}", f"t-{e.key[:20]}.manifest.json"])
    doc = json.loads(e.manifest.read_text())
    assert doc["key"] == e.key and doc["params"] == {"n": 50} and doc["file"] == e.payload.name
    assert doc["bytes"] == e.payload.stat().st_size


def test_a_writer_that_dies_leaves_no_entry(tmp_path, monkeypatch, no_warnings):
    e = _entry(tmp_path)
    e.save(FRAME)  # an older, complete entry of the same key

    def dies(df, path):
        path.write_bytes(b"PAR1 half a parquet")
        raise OSError("killed")

    monkeypatch.setitem(cache.FORMATS, "parquet", (dies, pd.read_parquet))
    with pytest.raises(OSError, match="killed"):
        e.save(FRAME)
    monkeypatch.undo()
    assert not e.is_complete() and e.load() is None  # missing, not partial, and no warning
    assert not e.manifest.exists()
    assert [p.name for p in tmp_path.iterdir()] == [e.payload.name]  # no temporary file left
    e.save(FRAME)
    pd.testing.assert_frame_equal(e.load()[0], FRAME)


def test_a_payload_without_manifest_is_missing_without_warning(tmp_path, no_warnings):
    e = _entry(tmp_path)
    e.save(FRAME)
    e.manifest.unlink()  # the writer died between payload and manifest
    assert e.load() is None


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(bytes(range(256)) * (p.stat().st_size // 256 + 1))


def _flip_one_byte(p: Path) -> None:  # same size, different content
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _zero_values(p: Path) -> None:  # a valid parquet with the wrong numbers
    df = pd.read_parquet(p)
    num = df.select_dtypes("number").columns
    df[num] = 0
    df.to_parquet(p)


#: (name, which file, how it is broken, what the warning says)
CORRUPTIONS = [
    ("truncated payload", "payload", _truncate, "SHA-256 differs"),
    ("zero-byte payload", "payload", lambda p: p.write_bytes(b""), r"SHA-256 differs.*\(0 bytes"),
    ("garbage payload", "payload", _garbage, "SHA-256 differs"),
    ("one byte flipped", "payload", _flip_one_byte, "SHA-256 differs"),
    ("values zeroed", "payload", _zero_values, "SHA-256 differs"),
    ("truncated manifest", "manifest", _truncate, "unreadable manifest"),
    ("manifest of another entry", "manifest",
     lambda p: p.write_text(p.read_text().replace('"key": "', '"key": "0')),
     "describes another entry"),
    ("missing payload", "payload", lambda p: p.unlink(), "payload file missing"),
]
IDS = [c[0] for c in CORRUPTIONS]


@pytest.mark.parametrize("name,which,corrupt,reason", CORRUPTIONS, ids=IDS)
def test_a_broken_entry_is_warned_about_and_missing(tmp_path, name, which, corrupt, reason):
    e = _entry(tmp_path)
    e.save(FRAME)
    path = getattr(e, which)
    corrupt(path)
    with pytest.warns(CacheWarning, match=re.escape(str(path)) + ".*" + reason):
        assert e.load() is None
    e.save(FRAME)
    pd.testing.assert_frame_equal(e.load()[0], FRAME)


def test_a_payload_that_cannot_be_parsed_is_missing(tmp_path):
    e = _entry(tmp_path, "json")
    e.save({"a": 1}, write=lambda v, p: p.write_text("{not json"))  # checks out, cannot be read
    with pytest.warns(CacheWarning, match=re.escape(str(e.payload)) + ".*unreadable payload"):
        assert e.load() is None


# --- through the modules: carbon signal, prepared workload, sweep results --------------------


def _carbon_case(tmp_path, monkeypatch):
    monkeypatch.setenv("CARBONROUTER_CACHE_DIR", str(tmp_path / "cache"))
    cfg = CarbonConfig(regions=("GB",), entsoe_regions=(), step="1h")
    try:
        entry = carbon._cache_entry(cfg, cfg.source_names())
        CarbonSignal.from_config(cfg)
    except DataUnavailableError as exc:  # pragma: no cover
        pytest.skip(f"carbon data unavailable: {exc}")

    def build():
        return CarbonSignal.from_config(cfg).frame

    return entry, build, lambda a, b: pd.testing.assert_frame_equal(a, b)


#: The sweep cases' workload (seed 7), in the session's cache.
WORKLOAD = prepared.WorkloadConfig(dataset="mooncake", max_conversations=40, seed=7)
#: A configuration of its own (seed 9) for the case that breaks its entry in the session's
#: cache: no other test reads it (the sweep cases, which may run at the same time in another
#: test process, read WORKLOAD's).
BROKEN_WORKLOAD = prepared.WorkloadConfig(dataset="mooncake", max_conversations=40, seed=9)


def _prepared_case(tmp_path, monkeypatch):
    entry = cache.entry("workload", BROKEN_WORKLOAD.to_dict(), "carbonrouter_lib.prepared")
    assert entry.key == BROKEN_WORKLOAD.key()
    prepared.prepare_workload(BROKEN_WORKLOAD)  # in the session's cache (its columns take minutes)
    return (entry, lambda: prepared.prepare_workload(BROKEN_WORKLOAD),
            pd.testing.assert_frame_equal)


def _sweep_case(tmp_path, monkeypatch):
    spec = RunSpec.make(WORKLOAD, SimulationConfig(), "faircarbon")
    runs = []

    def build():
        res = sweep.run_sweep([spec], cache_dir=tmp_path, serial=True, progress=False)
        runs.append(res.n_computed)
        return res[spec.key()]

    build()
    assert runs == [1]
    return sweep._entry(tmp_path, spec), build, pd.testing.assert_frame_equal


CASES = {"carbon_signal": _carbon_case, "prepared_workload": _prepared_case,
         "sweep_result": _sweep_case}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name,which,corrupt,reason",
                         [c for c in CORRUPTIONS if c[0] != "manifest of another entry"],
                         ids=[i for i in IDS if i != "manifest of another entry"])
def test_modules_detect_warn_and_rebuild(tmp_path, monkeypatch, case, name, which, corrupt,
                                         reason):
    entry, build, assert_equal = CASES[case](tmp_path, monkeypatch)
    assert entry.is_complete()
    good = build()
    path = getattr(entry, which)
    corrupt(path)
    with pytest.warns(CacheWarning, match=re.escape(str(path)) + ".*" + reason):
        rebuilt = build()
    assert_equal(rebuilt, good)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert entry.is_complete()  # rebuilt and written again
        assert_equal(build(), good)


def test_a_sweep_whose_write_dies_leaves_no_result(tmp_path, monkeypatch):
    spec = RunSpec.make(WORKLOAD, SimulationConfig(), "session-affinity")
    sweep._prepare_inputs([spec])  # the workload and the signal are in the cache already

    def dies(df, path):
        path.write_bytes(b"PAR1")
        raise OSError("disk full")

    monkeypatch.setitem(cache.FORMATS, "parquet", (dies, pd.read_parquet))
    with pytest.raises(RuntimeError, match="disk full"):
        sweep.run_sweep([spec], cache_dir=tmp_path, serial=True, progress=False)
    monkeypatch.undo()
    assert not sweep.is_complete(spec, tmp_path)
    assert not any(p.is_file() for p in tmp_path.iterdir())  # nothing half-written is left
    res = sweep.run_sweep([spec], cache_dir=tmp_path, serial=True, progress=False)
    assert res.n_computed == 1 and sweep.is_complete(spec, tmp_path)
