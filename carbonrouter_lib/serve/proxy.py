"""The OpenAI-compatible routing proxy (FastAPI): CarbonRouter in front of real engines.

Endpoints
---------
- ``POST /v1/chat/completions``: routes the request with :class:`~carbonrouter_lib.serve.core.
  RouterCore` and forwards it to the chosen engine (``model`` replaced by the engine's served
  model), non-streaming or as an SSE pass-through. A request naming one of the engines' served
  models is routed among the deployments serving it; any other name (e.g. ``carbonrouter``)
  lets the policy choose the model. The body field ``carbonrouter`` (quality, output estimate,
  last turn; see :data:`~carbonrouter_lib.serve.core.EXTENSION`) is read and not forwarded.
  Every response carries ``x-carbonrouter-deployment`` (the deployment id) and
  ``x-carbonrouter-gco2e`` (Ĉ(a), the estimated carbon at dispatch, Eq. 5); non-streaming
  responses also ``x-carbonrouter-gco2e-realized`` (realized output, engine-reported cache)
  and ``x-carbonrouter-completion-s`` (when the router completes the turn, clock seconds).
- ``GET /v1/models``, ``GET /healthz``, ``GET /metrics`` (Prometheus),
  ``GET /v1/carbonrouter/decisions`` (the decision records, no message text).

Reliability: an engine that refuses the connection, times out or answers 5xx before the first
byte reaches the client is retried on the next-best feasible deployment (the policy decides
again without it) up to ``router.retries`` times, and cooled down for ``router.cooldown_s``.
A session's turns are served one at a time (a lock per session). No request body, message or
key is logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from carbonrouter_lib.serve.core import EXTENSION, RouterCore, Turn, _count

__all__ = ["ENGINE_KEEPALIVE_S", "create_app"]

log = logging.getLogger("carbonrouter.serve.proxy")

#: How long the proxy keeps an idle connection to an engine for reuse, s: shorter than the
#: engines' own keep-alive (vLLM's and SGLang's uvicorn close idle connections after 5 s, the
#: emulators after 30 s). Reusing a connection the engine is closing fails the request (an
#: empty ``ReadError``), which the proxy would retry elsewhere and cool the engine down for.
ENGINE_KEEPALIVE_S = 2.0


class _Held:
    """A session lock held by one request, released exactly once (by whichever path ends
    the request: a response, the end of a stream, an error)."""

    def __init__(self, lock) -> None:
        self._lock, self._held = lock, False

    async def acquire(self) -> None:
        await self._lock.acquire()
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()


class _EngineFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Relay(StreamingResponse):
    """A streamed reply whose ``close`` (an async callable) runs however the response ends. A
    client that leaves before the first chunk ends it before its body's generator starts
    (Starlette cancels the body when it hears the disconnect, ASGI < 2.4, or fails at sending
    the response's start, 2.4), and a generator that never started never runs its ``finally``:
    the session's lock, its turn and the engine's stream were held for good."""

    def __init__(self, content, close, **kw) -> None:
        super().__init__(content, **kw)
        self._close = close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _headers(core: RouterCore, turn: Turn) -> dict[str, str]:
    return {"x-carbonrouter-deployment": core.specs[turn.a].id,
            "x-carbonrouter-gco2e": f"{turn.est_carbon_g:.6g}",
            "x-carbonrouter-session": turn.query.key,
            "x-carbonrouter-cached-tokens": f"{turn.cached:.0f}"}


def create_app(core: RouterCore) -> FastAPI:
    """The proxy app around a router core (its engines are called with httpx)."""
    rc = core.config.router
    timeout = httpx.Timeout(connect=rc.connect_timeout_s, read=rc.read_timeout_s,
                            write=rc.read_timeout_s, pool=None)
    served = {spec.engine_model for spec in core.specs.values()}
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state["client"] = httpx.AsyncClient(timeout=timeout, limits=app.state.engine_limits)
        try:
            yield
        finally:
            await state["client"].aclose()
            await core.signal.aclose()

    app = FastAPI(title="carbonrouter proxy", lifespan=lifespan)
    app.state.core = core
    app.state.engine_limits = httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                           keepalive_expiry=ENGINE_KEEPALIVE_S)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "deployments": len(core.specs), "cooling": core.cooling(),
                "policy": core.policy.name}

    @app.get("/metrics")
    async def metrics() -> Response:
        core.cooling()
        return Response(core.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        ids = ["carbonrouter", *sorted(served)]
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                            "owned_by": "carbonrouter"} for m in ids]}

    @app.get("/v1/carbonrouter/decisions")
    async def decisions() -> JSONResponse:
        return JSONResponse(core.decisions())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not JSON", "invalid_request_error")
        t_in = time.perf_counter()  # the router's own time starts with a received body
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request_error")
        ext = body.pop(EXTENSION, None)
        try:
            q = core.query(body.get("messages"), request.headers.get(rc.session_header), ext,
                           body.get("max_tokens") or body.get("max_completion_tokens"))
        except (ValueError, TypeError, AttributeError) as exc:
            return _error(400, f"bad request: {exc}", "invalid_request_error")
        exclude = set()
        if body.get("model") in served:  # pinned to one served model
            exclude = {a for a, s in core.specs.items() if s.engine_model != body["model"]}
        lock = _Held(core.session(q.session).lock)
        await lock.acquire()
        try:
            return await _serve(body, q, exclude, lock, t_in)
        except BaseException:
            lock.release()
            raise

    async def _serve(body: dict, q, exclude: set[int], lock, t_in: float) -> Response:
        engine_s = 0.0
        stream = bool(body.get("stream"))
        tried: list[int] = []
        for attempt in range(rc.retries + 1):
            turn = await core.route(q, exclude=[*exclude, *tried], attempt=attempt)
            if turn is None:
                lock.release()
                what = "every feasible deployment failed" if tried else \
                    "no deployment can serve this query (capacity, quality or context window)"
                return _error(503, what, "carbonrouter_unavailable")
            spec = core.specs[turn.a]
            fwd = {**body, "model": spec.engine_model}
            if stream:  # the router needs the usage chunk, whatever the client asked
                fwd["stream_options"] = {**(body.get("stream_options") or {}),
                                         "include_usage": True}
            t_eng = time.perf_counter()
            try:
                if stream:
                    return await _stream(body, fwd, turn, lock, t_in, t_eng - t_in)
                r = await state["client"].post(spec.base_url + "/chat/completions", json=fwd)
                engine_s += time.perf_counter() - t_eng
                if r.status_code >= 500:
                    raise _EngineFailed(f"status_{r.status_code}")
            except _EngineFailed as exc:
                _retry(turn, exc.reason, tried)
                continue
            except httpx.TimeoutException:
                engine_s += time.perf_counter() - t_eng
                _retry(turn, "timeout", tried)
                continue
            except httpx.TransportError:
                engine_s += time.perf_counter() - t_eng
                _retry(turn, "connect", tried)
                continue
            try:
                data = r.json()
            except json.JSONDecodeError:
                _retry(turn, "bad_body", tried)
                continue
            headers = _headers(core, turn)
            if r.status_code >= 400:  # the engine refused the request itself: no retry
                core.fail(turn, f"status_{r.status_code}", cooldown=False)
                lock.release()
                return JSONResponse(data, status_code=r.status_code, headers=headers)
            text = "".join((c.get("message") or {}).get("content") or ""
                           for c in data.get("choices") or [])
            cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get(
                "cached_tokens")
            rec = core.finish(turn, _count(text, spec.family), cached,
                              overhead_s=time.perf_counter() - t_in - engine_s)
            lock.release()
            headers["x-carbonrouter-gco2e-realized"] = f"{rec['carbon_g']:.6g}"
            headers["x-carbonrouter-completion-s"] = repr(float(rec["completion_s"]))
            return JSONResponse(data, headers=headers)
        lock.release()
        return _error(502, f"the engines failed {len(tried)} times", "carbonrouter_bad_gateway")

    def _retry(turn: Turn, reason: str, tried: list[int]) -> None:
        log.warning("engine %s failed (%s); retrying elsewhere", core.specs[turn.a].id, reason)
        core.fail(turn, reason)
        tried.append(turn.a)

    async def _stream(body: dict, fwd: dict, turn: Turn, lock, t_in: float,
                      pre_s: float) -> Response:
        spec = core.specs[turn.a]
        client: httpx.AsyncClient = state["client"]
        req = client.build_request("POST", spec.base_url + "/chat/completions", json=fwd)
        resp = await client.send(req, stream=True)  # transport errors propagate: retried
        if resp.status_code >= 500:
            await resp.aclose()
            raise _EngineFailed(f"status_{resp.status_code}")
        headers = _headers(core, turn)
        if resp.status_code >= 400:
            data = json.loads(await resp.aread() or b"{}")
            await resp.aclose()
            core.fail(turn, f"status_{resp.status_code}", cooldown=False)
            lock.release()
            return JSONResponse(data, status_code=resp.status_code, headers=headers)
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        settled = False

        def settle(parts: list[str], cached) -> None:
            # before [DONE] reaches the client: its next turn may follow
            nonlocal settled
            settled = True
            core.finish(turn, _count("".join(parts), spec.family), cached, overhead_s=pre_s)
            lock.release()

        async def close() -> None:
            # the engine or the client broke off before [DONE]: the turn did not complete. Run
            # by the relay's end and by the response's (once each; the second does nothing)
            nonlocal settled
            await resp.aclose()
            if not settled:
                settled = True
                core.fail(turn, "stream", cooldown=False)
                lock.release()

        async def relay():
            parts: list[str] = []
            cached = None
            try:
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        settle(parts, cached)
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        for c in chunk.get("choices") or []:
                            parts.append((c.get("delta") or {}).get("content") or "")
                        usage = chunk.get("usage")
                        if usage:
                            cached = (usage.get("prompt_tokens_details") or {}).get(
                                "cached_tokens")
                            if not wants_usage and not chunk.get("choices"):
                                continue  # the usage-only chunk the client did not ask for
                    yield line + "\n"
                if not settled:  # an engine that closes the stream without [DONE]
                    settle(parts, cached)
            finally:
                await close()

        return _Relay(relay(), close, media_type="text/event-stream", headers=headers)

    return app
