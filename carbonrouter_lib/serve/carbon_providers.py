"""Carbon-intensity providers behind one small interface, and the cache that makes them safe.

A :class:`CarbonProvider` answers one question: ``await provider.fetch(zone, now)`` — the grid
intensity of ``zone`` at (or latest before) ``now``, as a :class:`Reading` that keeps its
provenance: average or marginal, estimated or measured, the value's own timestamp.

- :class:`ReplayProvider`: the project's carbon data (:class:`carbonrouter_lib.carbon.
  CarbonSignal`) on the proxy's clock — the offline default, no network.
- :class:`ElectricityMapsProvider`: ``/v3/carbon-intensity/latest`` (and ``/forecast``),
  average (life-cycle or direct) intensity; key from ``$ELECTRICITYMAPS_API_KEY``.
- :class:`WattTimeProvider`: v3 ``co2_moer`` (marginal), lbs/MWh converted to gCO2e/kWh; login
  from ``$WATTTIME_USERNAME`` / ``$WATTTIME_PASSWORD``.
- :class:`CarbonAwareSDKProvider`: the Green Software Foundation Carbon Aware SDK's Web API
  (``/emissions/bylocation``), self-hosted; optional key from ``$CARBON_AWARE_API_KEY``.

:class:`CachedSignal` wraps a provider for the router: a TTL cache per zone; when a fetch fails,
the last known value while it is at most ``max_stale_s`` old, then the configured default — each
reading tagged with its ``source`` (live, cache, stale, default) for ``/metrics``. Keys are read
from the environment only, sent only in headers, and never logged or put in an error message.

Units: gCO2e/kWh; times in s since the Unix epoch.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import httpx
import numpy as np
import pandas as pd

from carbonrouter_lib.carbon import CarbonConfig, CarbonSignal

__all__ = [
    "LBS_PER_MWH_TO_G_PER_KWH",
    "Reading",
    "CarbonProvider",
    "ReplayProvider",
    "ElectricityMapsProvider",
    "WattTimeProvider",
    "CarbonAwareSDKProvider",
    "CachedSignal",
    "make_provider",
]

log = logging.getLogger("carbonrouter.serve.carbon")

#: 1 lb/MWh in g/kWh: 453.59237 g per 1,000 kWh.
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237


@dataclass(frozen=True)
class Reading:
    """One intensity value and where it comes from.

    Attributes
    ----------
    zone : str
    gco2_per_kwh : float
        Intensity, gCO2e/kWh.
    kind : str
        ``"average"`` or ``"marginal"``.
    estimated : bool or None
        Whether the provider marks the value as estimated (forecast, nowcast); None: unknown.
    timestamp : float
        Time the value is for, s since the Unix epoch.
    provider : str
    source : str
        ``"live"`` (just fetched), ``"cache"`` (within the TTL), ``"stale"`` (a failed fetch,
        last known value), ``"default"`` (nothing usable: the configured value).
    """

    zone: str
    gco2_per_kwh: float
    kind: str
    estimated: bool | None
    timestamp: float
    provider: str
    source: str = "live"


class CarbonProvider(abc.ABC):
    """Intensity of grid zones; subclasses implement :meth:`fetch`."""

    name: str = ""
    #: Whether :class:`CachedSignal` may reuse a value for ``ttl_s`` (live APIs); a replay is
    #: read at every call (its value depends on the virtual time).
    cacheable: bool = True

    def validate_zones(self, zones: Sequence[str]) -> None:
        """Raise ``ValueError`` naming a zone the provider cannot serve (checked at start-up)."""
        for z in zones:
            if not isinstance(z, str) or not z.strip():
                raise ValueError(f"{self.name}: empty zone name {z!r}")

    @abc.abstractmethod
    async def fetch(self, zone: str, now: float) -> Reading:
        """The intensity of ``zone`` in force at ``now`` (s since the epoch), gCO2e/kWh."""

    def peek(self, zone: str, now: float) -> Reading | None:
        """The reading when it needs no I/O (a local replay), else None."""
        return None

    async def aclose(self) -> None:  # noqa: B027 (optional hook: most providers hold nothing)
        """Release connections."""


def _epoch(stamp: str) -> float:
    ts = pd.Timestamp(stamp)
    ts = ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")
    return ts.value / 1e9


def _key(env: str, required: bool = True) -> str | None:
    value = os.environ.get(env)
    if required and not value:
        raise ValueError(f"the API key is read from ${env}, which is not set")
    return value


class ReplayProvider(CarbonProvider):
    """The project's carbon data, read at the proxy's (virtual) time.

    Parameters
    ----------
    zones
        Zones to serve (regions of :class:`~carbonrouter_lib.carbon.CarbonConfig`).
    year
        Carbon year.
    signal
        A ready signal (default: built from ``zones`` and ``year``, parquet-cached).
    """

    name = "replay"
    cacheable = False

    def __init__(self, zones: Sequence[str], year: int = 2022,
                 signal: CarbonSignal | None = None) -> None:
        self.validate_zones(zones)
        if signal is None:
            signal = CarbonSignal.from_config(CarbonConfig(year=year, regions=tuple(zones)))
        self.signal = signal

    def validate_zones(self, zones: Sequence[str]) -> None:
        super().validate_zones(zones)
        try:
            CarbonConfig(regions=tuple(dict.fromkeys(zones)))
        except ValueError as exc:
            raise ValueError(f"replay: {exc}") from None

    def peek(self, zone: str, now: float) -> Reading:
        row = self.signal.row_index(now)  # raises outside the data's year
        value = float(self.signal.at(now)[self.signal.region_index(zone)])
        return Reading(zone, value, "average", False, self.signal.row_interval(row)[0],
                       self.name)

    async def fetch(self, zone: str, now: float) -> Reading:
        return self.peek(zone, now)


class _HTTPProvider(CarbonProvider):
    default_base_url = ""

    def __init__(self, base_url: str | None = None, timeout_s: float = 5.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        if not self.base_url:
            raise ValueError(f"{self.name}: base_url is required")
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    async def _get(self, path: str, params: Mapping[str, str], headers: Mapping[str, str]
                   ) -> dict | list:
        r = await self._client.get(self.base_url + path, params=params, headers=headers)
        r.raise_for_status()
        return r.json()

    async def aclose(self) -> None:
        await self._client.aclose()


class ElectricityMapsProvider(_HTTPProvider):
    """Electricity Maps API v3: average intensity (life-cycle unless the account says direct).

    ``fetch`` reads ``/v3/carbon-intensity/latest?zone=Z``; :meth:`forecast` reads
    ``/v3/carbon-intensity/forecast``. Key: ``$ELECTRICITYMAPS_API_KEY`` (header ``auth-token``).
    """

    name = "electricitymaps"
    default_base_url = "https://api.electricitymap.org"
    key_env = "ELECTRICITYMAPS_API_KEY"

    def _headers(self) -> dict[str, str]:
        return {"auth-token": _key(self.key_env)}

    async def fetch(self, zone: str, now: float) -> Reading:
        doc = await self._get("/v3/carbon-intensity/latest", {"zone": zone}, self._headers())
        value = float(doc["carbonIntensity"])
        return Reading(zone, value, "average", bool(doc.get("isEstimated", False)),
                       _epoch(doc["datetime"]), self.name)

    async def forecast(self, zone: str) -> pd.Series:
        """The provider's forecast for ``zone``: gCO2e/kWh indexed by UTC time."""
        doc = await self._get("/v3/carbon-intensity/forecast", {"zone": zone}, self._headers())
        points = doc["forecast"]
        return pd.Series([float(p["carbonIntensity"]) for p in points],
                         index=pd.to_datetime([p["datetime"] for p in points], utc=True),
                         name=zone)


class WattTimeProvider(_HTTPProvider):
    """WattTime API v3, signal ``co2_moer`` (marginal operating emissions rate).

    Logs in with ``$WATTTIME_USERNAME`` / ``$WATTTIME_PASSWORD`` (``/login``, HTTP basic auth;
    the token is renewed once on a 401) and reads the first point of ``/v3/forecast`` (the
    current five-minute value). Values in lbs/MWh are converted to gCO2e/kWh.
    """

    name = "watttime"
    default_base_url = "https://api.watttime.org"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._token: str | None = None

    async def _login(self) -> str:
        user, password = _key("WATTTIME_USERNAME"), _key("WATTTIME_PASSWORD")
        r = await self._client.get(self.base_url + "/login", auth=(user, password))
        r.raise_for_status()
        self._token = r.json()["token"]
        return self._token

    async def fetch(self, zone: str, now: float) -> Reading:
        params = {"region": zone, "signal_type": "co2_moer", "horizon_hours": "0"}
        for attempt in range(2):
            token = self._token or await self._login()
            try:
                doc = await self._get("/v3/forecast", params,
                                      {"Authorization": f"Bearer {token}"})
                break
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 401 or attempt:
                    raise
                self._token = None  # expired: log in again once
        point = doc["data"][0]
        units = doc.get("meta", {}).get("units", "lbs_co2_per_mwh")
        value = float(point["value"])
        if units == "lbs_co2_per_mwh":
            value *= LBS_PER_MWH_TO_G_PER_KWH
        elif units not in ("g_co2_per_kwh", "gco2_per_kwh"):
            raise ValueError(f"watttime: unknown units {units!r}")
        return Reading(zone, value, "marginal", True, _epoch(point["point_time"]), self.name)


class CarbonAwareSDKProvider(_HTTPProvider):
    """The Carbon Aware SDK's Web API (self-hosted: ``base_url`` is required).

    Reads ``/emissions/bylocation?location=Z`` (its ``rating`` is gCO2e/kWh) and takes the
    latest entry at or before ``now``. ``kind`` says whether the SDK's configured data source
    gives average or marginal intensity (the API does not). Optional key:
    ``$CARBON_AWARE_API_KEY`` (header ``x-api-key``).
    """

    name = "carbon-aware-sdk"

    def __init__(self, base_url: str | None = None, timeout_s: float = 5.0,
                 client: httpx.AsyncClient | None = None, kind: str = "average") -> None:
        super().__init__(base_url, timeout_s, client)
        self.kind = kind

    async def fetch(self, zone: str, now: float) -> Reading:
        key = _key("CARBON_AWARE_API_KEY", required=False)
        headers = {"x-api-key": key} if key else {}
        doc = await self._get("/emissions/bylocation", {"location": zone}, headers)
        points = sorted(((_epoch(p["time"]), float(p["rating"])) for p in doc),
                        key=lambda x: x[0])
        if not points:
            raise ValueError(f"carbon-aware-sdk: no emissions data for {zone!r}")
        before = [p for p in points if p[0] <= now] or points[:1]
        t, value = before[-1]
        return Reading(zone, value, self.kind, None, t, self.name)


def make_provider(spec, zones: Sequence[str], signal: CarbonSignal | None = None,
                  client: httpx.AsyncClient | None = None) -> CarbonProvider:
    """The provider of a :class:`~carbonrouter_lib.serve.config.CarbonSpec` for ``zones``
    (zones are checked; a missing key fails here, at start-up, naming its variable)."""
    if spec.provider == "replay":
        return ReplayProvider(zones, spec.year, signal)
    if spec.provider == "electricitymaps":
        _key(ElectricityMapsProvider.key_env)
        p: CarbonProvider = ElectricityMapsProvider(spec.base_url, spec.timeout_s, client)
    elif spec.provider == "watttime":
        _key("WATTTIME_USERNAME")
        _key("WATTTIME_PASSWORD")
        p = WattTimeProvider(spec.base_url, spec.timeout_s, client)
    else:
        p = CarbonAwareSDKProvider(spec.base_url, spec.timeout_s, client, kind=spec.kind)
    p.validate_zones(zones)
    return p


class CachedSignal:
    """A provider with a TTL cache, last-known-value fallback and a default of last resort.

    Parameters
    ----------
    provider
        The provider.
    zones
        The zone of each region, in region order (:meth:`intensities` returns this order).
    ttl_s
        Wall seconds a live value is reused (ignored for non-cacheable providers).
    max_stale_s
        A failed fetch returns the last known value while it was fetched at most this many wall
        seconds ago, else the default.
    default_gco2_per_kwh
        One value, or one per zone, gCO2e/kWh.
    wall
        Wall-clock function (tests).

    Attributes
    ----------
    readings : dict[str, Reading]
        The latest reading per zone (what ``/metrics`` shows).
    failures : dict[str, int]
        Failed fetches per zone.
    """

    def __init__(self, provider: CarbonProvider, zones: Sequence[str], ttl_s: float = 300.0,
                 max_stale_s: float = 3600.0,
                 default_gco2_per_kwh: float | Mapping[str, float] = 400.0,
                 wall=time.monotonic) -> None:
        self.provider, self.zones = provider, tuple(zones)
        self.ttl_s, self.max_stale_s = float(ttl_s), float(max_stale_s)
        d = default_gco2_per_kwh
        self._default = {z: float(d[z] if isinstance(d, Mapping) else d) for z in self.zones}
        for z, v in self._default.items():
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"default intensity of zone {z!r} must be ≥ 0, got {v!r}")
        self._wall = wall
        self._last: dict[str, tuple[float, Reading]] = {}  # zone → (wall time fetched, reading)
        self.readings: dict[str, Reading] = {}
        self.failures: dict[str, int] = dict.fromkeys(self.zones, 0)

    async def reading(self, zone: str, now: float) -> Reading:
        """The reading of ``zone`` at ``now`` (s since the epoch; the replay's time)."""
        wall = self._wall()
        last = self._last.get(zone)
        if self.provider.cacheable and last is not None and wall - last[0] <= self.ttl_s:
            out = replace(last[1], source="cache")
        else:
            try:
                out = await self.provider.fetch(zone, now)
                if not (math.isfinite(out.gco2_per_kwh) and out.gco2_per_kwh >= 0):
                    raise ValueError(f"intensity {out.gco2_per_kwh!r} is not a finite value ≥ 0")
                self._last[zone] = (wall, out)
            except Exception as exc:  # any failure degrades; the proxy keeps routing
                self.failures[zone] = self.failures.get(zone, 0) + 1
                # Only the exception's type and the zone: a message could echo a URL or header.
                log.warning("carbon provider %s failed for zone %s (%s)", self.provider.name,
                            zone, type(exc).__name__)
                if last is not None and wall - last[0] <= self.max_stale_s:
                    out = replace(last[1], source="stale")
                else:
                    out = Reading(zone, self._default[zone], "unknown", None, now,
                                  self.provider.name, "default")
        self.readings[zone] = out
        return out

    def intensities_nowait(self, now: float) -> np.ndarray | None:
        """:meth:`intensities` when no zone needs I/O (a replay, or values within the TTL),
        else None. The proxy's hot path: an ``await`` on a busy event loop waits its turn."""
        wall = self._wall()
        out = np.empty(len(self.zones))
        for i, z in enumerate(self.zones):
            try:
                r = self.provider.peek(z, now)
            except Exception:  # e.g. a replay queried outside its data: the fallbacks decide
                return None
            if r is None:
                last = self._last.get(z)
                if not (self.provider.cacheable and last is not None
                        and wall - last[0] <= self.ttl_s):
                    return None
                r = replace(last[1], source="cache")
            self.readings[z] = r
            out[i] = r.gco2_per_kwh
        return out

    async def intensities(self, now: float) -> np.ndarray:
        """gCO2e/kWh of every region (the order of ``zones``) at ``now``."""
        ready = self.intensities_nowait(now)
        if ready is not None:
            return ready
        readings = await asyncio.gather(*(self.reading(z, now) for z in dict.fromkeys(
            self.zones)))
        value = {r.zone: r.gco2_per_kwh for r in readings}
        return np.array([value[z] for z in self.zones], dtype=np.float64)

    async def aclose(self) -> None:
        """Close the provider."""
        await self.provider.aclose()
