"""The on-disk cache of derived results: content-derived keys, atomic writes, a check on read.

Where
-----
Everything lives under :func:`~carbonrouter_lib.datasets.cache_dir` (``$CARBONROUTER_CACHE_DIR``,
default ``<repo>/data/cache``); derived results under its ``derived/`` folder:

- ``carbon_signal-*``: carbon-intensity signals on their grid (:mod:`.carbon`);
- ``sharegpt_turns-*``: the ShareGPT turn table with token counts (:mod:`.sharegpt`);
- ``quality_predictor-*``, ``quality_heldout-*``: the fitted quality predictor and its held-out
  accuracy (:mod:`.quality`);
- ``workload-*``, ``workload_columns-*``: prepared workload tables and their per-dataset columns
  (:mod:`.prepared`);
- ``gates/gate-*``: learned switch gates (:mod:`.gate`); ``bounds/bound-*``: clairvoyant bounds
  (:mod:`.bound`); ``sweeps/run-*``: sweep results (:mod:`.sweep`; a sweep given its own
  ``cache_dir`` keeps its results there and its gates in ``<cache_dir>/gates``);
- ``gar_draws-*``: GAR†'s home-region draws per session id (:mod:`.policies.oblivious`).

(``cache_dir()`` itself also holds downloaded data files, checked against the data registry by
:mod:`.datasets`, and ``wheels/``.) Deleting the folder, or any file in it, is always safe: what is
missing is rebuilt (some entries, the quality predictor and the gates, take minutes).

Keys
----
An entry's key is the SHA-256 of the canonical JSON (sorted keys, no whitespace) of what produced
it: its parameters and inputs (configs, the SHA-256 of source files), and :func:`code_hash` of
the modules that compute it — the source of those modules and of every module of this package
they import, transitively (found with :mod:`ast`; computed once per process). Editing the
simulator thus invalidates sweep results but not carbon signals, and no version number needs
bumping. Keys are the same in every process (no ``hash()``, no dependence on dict order).

Entries
-------
One entry is two files in its folder: the payload ``<kind>-<key[:20]>.<fmt>`` (parquet, json or
joblib) and the manifest ``<kind>-<key[:20]>.manifest.json``, which names the payload with its size
and SHA-256 and holds the key, the parameters and the caller's metadata. Both are written to a
temporary file beside them and renamed into place (:func:`os.replace`), the payload first and
the manifest last: the manifest commits the entry, so a writer that dies mid-way leaves no entry
(at most a payload without manifest, which counts as missing). On read the manifest is parsed and
the payload's size and SHA-256 checked against it; a manifest that cannot be read, a missing,
truncated or modified payload, or a payload that cannot be parsed is treated as missing: a
:class:`CacheWarning` names the file and the reason, and the caller rebuilds the entry.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from carbonrouter_lib.datasets import derived_dir, file_sha256
from carbonrouter_lib.outputs import atomic_path

__all__ = ["FORMATS", "CacheWarning", "Entry", "canonical_json", "code_hash", "dependencies",
           "entry", "key"]

PACKAGE = "carbonrouter_lib"
_PACKAGE_DIR = Path(__file__).resolve().parent
#: Hex characters of the key in file names (80 bits; the manifest holds the whole key).
NAME_CHARS = 20


class CacheWarning(UserWarning):
    """A cache entry was found broken (unreadable, truncated, modified) and is ignored."""


# ---- keys -----------------------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cache key: {obj!r} ({type(obj).__name__}) is not JSON-serializable")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal parameters give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True,
                      default=_json_default)


def _source_file(module: str) -> Path | None:
    """The source file of a module of this package (None for any other module)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = _PACKAGE_DIR.joinpath(*parts[1:])
    for path in (Path(f"{base}.py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _imports(module: str, path: Path) -> frozenset[str]:
    """Modules of this package that ``module`` imports anywhere in its source (also inside
    functions and ``if TYPE_CHECKING:``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from .base import y
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + [node.module or ""])
                base = base.rstrip(".")
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # maybe submodules
    return frozenset(m for m in found if _source_file(m) is not None)


@functools.cache
def dependencies(*modules: str) -> tuple[str, ...]:
    """``modules`` and every module of this package they import, transitively (sorted)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _source_file(module)
        if path is None:
            raise ValueError(f"code_hash: {module!r} is not a module of {PACKAGE}")
        seen.add(module)
        todo.extend(_imports(module, path) - seen)
    return tuple(sorted(seen))


@functools.cache
def code_hash(*modules: str) -> str:
    """SHA-256 of the source of ``modules`` and their :func:`dependencies` (once per process:
    the code a process runs is the code it imported)."""
    digest = hashlib.sha256()
    for module in dependencies(*modules):
        digest.update(f"{module}\n".encode())
        digest.update(_source_file(module).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def key(kind: str, params: Any, *modules: str) -> str:
    """Key of an entry: SHA-256 (64 hex) of its ``kind``, its ``params`` (plain JSON: configs,
    inputs' hashes) and :func:`code_hash` of the ``modules`` that compute it."""
    doc = {"kind": kind, "params": params, "code": code_hash(*modules)}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


# ---- payload formats ------------------------------------------------------------------------


def _write_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, allow_nan=True, default=_json_default))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _write_joblib(obj: Any, path: Path) -> None:
    import joblib

    joblib.dump(obj, path)


def _read_joblib(path: Path) -> Any:
    import joblib

    return joblib.load(path)


#: ``{format: (write(value, path), read(path) -> value)}``; parquet keeps the index (a RangeIndex
#: as metadata only), so a frame reads back as it was written.
FORMATS: dict[str, tuple[Callable[[Any, Path], None], Callable[[Path], Any]]] = {
    "parquet": (lambda df, path: df.to_parquet(path), pd.read_parquet),
    "json": (_write_json, _read_json),
    "joblib": (_write_joblib, _read_joblib),
}


# ---- entries --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One cache entry: the payload ``<folder>/<kind>-<key[:20]>.<fmt>`` and its manifest
    ``<kind>-<key[:20]>.manifest.json`` (module docstring). ``params`` are recorded in the
    manifest (for a reader of the folder; the key already covers them)."""

    folder: Path
    kind: str
    key: str
    fmt: str = "parquet"
    params: Any = field(default=None, compare=False)

    @property
    def payload(self) -> Path:
        return self.folder / f"{self.kind}-{self.key[:NAME_CHARS]}.{self.fmt}"

    @property
    def manifest(self) -> Path:
        return self.folder / f"{self.kind}-{self.key[:NAME_CHARS]}.manifest.json"

    def _broken(self, path: Path, reason: str) -> None:
        warnings.warn(f"cache entry {path}: {reason}; treated as missing and rebuilt",
                      CacheWarning, stacklevel=4)

    def _checked_manifest(self) -> dict[str, Any] | None:
        """The manifest if the entry is complete and its payload is what the manifest says,
        else None (with a warning unless the entry is simply absent)."""
        if not self.manifest.is_file():  # never written, or its writer died before the end
            return None
        try:
            doc = json.loads(self.manifest.read_text())
            file, size, sha = doc["file"], doc["bytes"], doc["sha256"]
            if doc["key"] != self.key or file != self.payload.name:
                raise ValueError(f"it describes another entry ({file})")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return self._broken(self.manifest, f"unreadable manifest ({exc})")
        if not self.payload.is_file():
            return self._broken(self.payload, "payload file missing")
        if file_sha256(self.payload) != sha:
            actual = self.payload.stat().st_size
            return self._broken(self.payload, f"content SHA-256 differs from the manifest's "
                                              f"({actual} bytes, {size} written: truncated or "
                                              f"modified since)")
        return doc

    def is_complete(self) -> bool:
        """Whether the entry is there and its payload checks out against its manifest."""
        return self._checked_manifest() is not None

    def load(self, read: Callable[[Path], Any] | None = None) -> tuple[Any, dict] | None:
        """``(value, meta)`` of a complete, checked entry, else None. ``read`` (default the
        format's reader) parses the payload; if it fails, the entry is treated as missing."""
        doc = self._checked_manifest()
        if doc is None:
            return None
        try:
            value = (read or FORMATS[self.fmt][1])(self.payload)
        except Exception as exc:  # noqa: BLE001 — any parse error means: rebuild
            return self._broken(self.payload, f"unreadable payload ({type(exc).__name__}: {exc})")
        return value, doc.get("meta", {})

    def save(self, value: Any, meta: Any = None,
             write: Callable[[Any, Path], None] | None = None) -> Any:
        """Write ``value`` (with ``write``, default the format's writer) and ``meta`` (plain
        JSON, returned by :meth:`load`): payload first, manifest last, each atomically.
        Returns ``value``."""
        self.manifest.unlink(missing_ok=True)  # an old manifest never vouches for a new payload
        with atomic_path(self.payload) as tmp:
            (write or FORMATS[self.fmt][0])(value, tmp)
            size, sha = tmp.stat().st_size, file_sha256(tmp)
        doc = {"key": self.key, "kind": self.kind, "file": self.payload.name, "bytes": size,
               "sha256": sha, "params": self.params, "meta": meta if meta is not None else {}}
        with atomic_path(self.manifest) as tmp:
            tmp.write_text(json.dumps(doc, indent=1, allow_nan=True, default=_json_default))
        return value


def entry(kind: str, params: Any, *modules: str, folder: str | Path | None = None,
          fmt: str = "parquet") -> Entry:
    """The entry of ``kind`` produced from ``params`` by the code of ``modules`` (its key:
    :func:`key`), in ``folder`` (default :func:`~carbonrouter_lib.datasets.derived_dir`)."""
    if fmt not in FORMATS:
        raise ValueError(f"cache: unknown format {fmt!r}; one of {sorted(FORMATS)}")
    folder = Path(folder) if folder is not None else derived_dir()
    return Entry(folder, kind, key(kind, params, *modules), fmt, params)
