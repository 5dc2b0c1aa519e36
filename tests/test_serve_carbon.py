"""serve.carbon_providers against recorded responses (respx, no network): parsing, units,
provenance, the TTL cache, last-known-value fallback with a staleness limit, the default, and
keys that stay out of logs."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
import respx

from carbonrouter_lib.serve import carbon_providers as cp

# Recorded shapes of the providers' answers (values changed).
EM_LATEST = {"zone": "DE", "carbonIntensity": 302, "datetime": "2026-11-30T10:00:00.000Z",
             "updatedAt": "2026-11-30T10:41:07.000Z", "createdAt": "2026-11-27T10:43:27.000Z",
             "emissionFactorType": "lifecycle", "isEstimated": True,
             "estimationMethod": "TIME_SLICER_AVERAGE"}
EM_FORECAST = {"zone": "DE", "forecast": [
    {"carbonIntensity": 310, "datetime": "2026-11-30T11:00:00.000Z"},
    {"carbonIntensity": 280, "datetime": "2026-11-30T12:00:00.000Z"}],
    "updatedAt": "2026-11-30T10:41:07.000Z"}
WT_LOGIN = {"token": "tok-123"}
WT_FORECAST = {"data": [{"point_time": "2026-11-30T10:05:00+00:00", "value": 1000.0,
                         "version": "2026-03-01"},
                        {"point_time": "2026-11-30T10:10:00+00:00", "value": 990.0,
                         "version": "2026-03-01"}],
               "meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer",
                        "units": "lbs_co2_per_mwh", "generated_at": "2026-11-30T10:05:00+00:00",
                        "model": {"date": "2026-03-01"}}}
CAS_BYLOCATION = [
    {"location": "eastus", "time": "2026-11-30T08:00:00+00:00", "rating": 420.5,
     "duration": "01:00:00"},
    {"location": "eastus", "time": "2026-11-30T09:00:00+00:00", "rating": 390.25,
     "duration": "01:00:00"}]
NOW = 1_796_034_000.0  # 2026-11-30T10:20:00Z


def run(coro):
    return asyncio.run(coro)


@respx.mock
def test_electricitymaps_latest_and_forecast(monkeypatch):
    monkeypatch.setenv("ELECTRICITYMAPS_API_KEY", "em-secret")
    route = respx.get("https://api.electricitymap.org/v3/carbon-intensity/latest",
                      params={"zone": "DE"}).respond(json=EM_LATEST)
    respx.get("https://api.electricitymap.org/v3/carbon-intensity/forecast").respond(
        json=EM_FORECAST)
    p = cp.ElectricityMapsProvider()
    r = run(p.fetch("DE", NOW))
    assert (r.gco2_per_kwh, r.kind, r.estimated) == (302.0, "average", True)
    assert r.timestamp == pytest.approx(1_796_032_800.0)  # 10:00Z
    assert route.calls.last.request.headers["auth-token"] == "em-secret"
    fc = run(p.forecast("DE"))
    assert list(fc) == [310.0, 280.0] and str(fc.index[1]) == "2026-11-30 12:00:00+00:00"


@respx.mock
def test_watttime_marginal_in_g_per_kwh_and_relogin(monkeypatch):
    monkeypatch.setenv("WATTTIME_USERNAME", "me")
    monkeypatch.setenv("WATTTIME_PASSWORD", "wt-secret")
    login = respx.get("https://api.watttime.org/login").mock(side_effect=[
        httpx.Response(200, json={"token": "old"}), httpx.Response(200, json=WT_LOGIN)])
    fc = respx.get("https://api.watttime.org/v3/forecast").mock(side_effect=[
        httpx.Response(401, json={"error": "expired"}), httpx.Response(200, json=WT_FORECAST)])
    r = run(cp.WattTimeProvider().fetch("CAISO_NORTH", NOW))
    # 1000 lbs/MWh = 453.59237 g/kWh
    assert r.gco2_per_kwh == pytest.approx(453.59237)
    assert (r.kind, r.estimated) == ("marginal", True)
    assert login.call_count == 2  # the expired token was renewed once
    assert fc.calls.last.request.headers["authorization"] == "Bearer tok-123"
    assert fc.calls.last.request.url.params["signal_type"] == "co2_moer"


@respx.mock
def test_carbon_aware_sdk_latest_at_or_before_now():
    respx.get("http://127.0.0.1:9999/emissions/bylocation",
              params={"location": "eastus"}).respond(json=CAS_BYLOCATION)
    p = cp.CarbonAwareSDKProvider("http://127.0.0.1:9999", kind="marginal")
    r = run(p.fetch("eastus", NOW))
    assert (r.gco2_per_kwh, r.kind, r.estimated) == (390.25, "marginal", None)
    early = run(p.fetch("eastus", NOW - 2 * 3600))  # before 09:00: the 08:00 value
    assert early.gco2_per_kwh == 420.5


def test_missing_keys_fail_naming_the_variable(monkeypatch):
    from carbonrouter_lib.serve.config import CarbonSpec

    monkeypatch.delenv("ELECTRICITYMAPS_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"\$ELECTRICITYMAPS_API_KEY"):
        cp.make_provider(CarbonSpec(provider="electricitymaps"), ["DE"])
    monkeypatch.delenv("WATTTIME_PASSWORD", raising=False)
    monkeypatch.setenv("WATTTIME_USERNAME", "me")
    with pytest.raises(ValueError, match=r"\$WATTTIME_PASSWORD"):
        cp.make_provider(CarbonSpec(provider="watttime"), ["CAISO_NORTH"])
    with pytest.raises(ValueError, match="base_url is required"):
        cp.make_provider(CarbonSpec(provider="carbon-aware-sdk"), ["eastus"])


@respx.mock
def test_cache_ttl_stale_fallback_then_default_and_no_key_in_logs(monkeypatch, caplog):
    monkeypatch.setenv("ELECTRICITYMAPS_API_KEY", "em-secret-key")
    route = respx.get("https://api.electricitymap.org/v3/carbon-intensity/latest")
    route.side_effect = [httpx.Response(200, json=EM_LATEST),
                         httpx.Response(503, text="em-secret-key upstream down"),
                         httpx.ConnectError("down"), httpx.ConnectError("down")]
    wall = [0.0]
    sig = cp.CachedSignal(cp.ElectricityMapsProvider(), ["DE"], ttl_s=60, max_stale_s=600,
                          default_gco2_per_kwh={"DE": 123.0}, wall=lambda: wall[0])
    caplog.set_level(logging.DEBUG)
    assert run(sig.reading("DE", NOW)).source == "live"
    wall[0] = 30.0
    r = run(sig.reading("DE", NOW))
    assert (r.source, r.gco2_per_kwh, route.call_count) == ("cache", 302.0, 1)
    wall[0] = 100.0  # past the TTL: the fetch fails, the last value is 100 s old
    r = run(sig.reading("DE", NOW))
    assert (r.source, r.gco2_per_kwh, route.call_count) == ("stale", 302.0, 2)
    wall[0] = 590.0
    assert run(sig.reading("DE", NOW)).source == "stale"
    wall[0] = 700.0  # older than max_stale_s: the configured default
    r = run(sig.reading("DE", NOW))
    assert (r.source, r.gco2_per_kwh, r.kind) == ("default", 123.0, "unknown")
    assert sig.failures["DE"] == 3
    assert "em-secret-key" not in caplog.text
    assert "failed for zone DE" in caplog.text


def test_replay_provider_follows_the_virtual_clock():
    from carbonrouter_lib.carbon import CarbonConfig, CarbonSignal

    signal = CarbonSignal.from_config(CarbonConfig(year=2022, regions=("GB", "BE")))
    p = cp.ReplayProvider(["GB", "BE"], signal=signal)
    sig = cp.CachedSignal(p, ["GB", "BE"], ttl_s=3600)
    t0 = 1_641_168_000.0  # 2022-01-03T00:00Z
    for t in (t0, t0 + 3 * 3600 + 17):
        ci = run(sig.intensities(t))
        assert list(ci) == list(signal.at(t))  # never cached across virtual time
        assert sig.readings["GB"].kind == "average" and sig.readings["GB"].estimated is False
    assert sig.readings["BE"].timestamp == t0 + 3 * 3600  # the 5-min grid row in force
