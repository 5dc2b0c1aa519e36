"""An emulated OpenAI-compatible engine per deployment, for tests and demos (no GPU).

Each :class:`EngineEmulator` is a small FastAPI app that behaves like one vLLM / SGLang
deployment as far as a router can tell:

- a **block-level prefix cache** (:class:`PrefixCache`): prompts are token ids (the
  deployment's tokenizer, each message's content encoded on its own and concatenated — the
  project's counting rule), cut into 16-token blocks identified by chained hashes (a block's
  hash covers every token before it), kept in LRU order within a capacity in tokens (a
  sequence's blocks are touched tail first, so its tail is evicted first and a prefix stays
  usable, as in vLLM); a request reuses the longest run of cached leading blocks (never the
  whole prompt: its last token is always computed, as vLLM does), then caches its prompt and its
  output (a sequence longer than the memory keeps its leading blocks);
- **timing from the deployment's profile**: TTFT = uncached prompt tokens / v_pre, then the
  output at v_dec tokens/s (Eq. 6, ``docs/model.md`` §4), divided by the clock's scale so that
  tests run fast;
- ``usage.prompt_tokens_details.cached_tokens``; SSE streaming (``stream_options.
  include_usage``); ``GET /v1/models``;
- **fault injection** (``POST /emulator/faults``): the next *n* requests fail with HTTP 500,
  hang (a timeout for the caller), or run ``slow`` times slower.

The reply is the text in the request's ``emulator.response`` field when given (replays of a
trace), else deterministic filler of ``max_tokens`` words (default 32).

:class:`EmulatorCluster` runs one emulator per deployment of a configuration, each on its own
127.0.0.1 port, in a background thread; deployments of one (region, GPU) pool share one cache
memory, as the router's model of a pool assumes.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import math
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from carbonrouter_lib.serve.config import DeploymentSpec, ServeConfig
from carbonrouter_lib.tokenizers import encode

__all__ = ["BLOCK_TOKENS", "PrefixCache", "Faults", "EngineEmulator", "EmulatorCluster",
           "SERVER_KEEP_ALIVE_S", "ServerThread", "free_ports"]

#: Tokens per KV block (vLLM's default block size).
BLOCK_TOKENS = 16

_WORDS = ("the carbon router sends each turn to the deployment with the lowest estimated "
          "emissions while the cached history stays where it was computed and a switch must "
          "pay for its recomputation").split()


class PrefixCache:
    """Block-level prefix cache with chained block hashes and LRU eviction.

    Parameters
    ----------
    capacity_tokens
        Memory, tokens (whole blocks are kept: ``capacity_tokens // block`` blocks).
    block
        Tokens per block.
    """

    def __init__(self, capacity_tokens: float, block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self.capacity_blocks = max(1, int(capacity_tokens) // block)
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.evicted_blocks = 0

    def _hashes(self, root: str, ids: Sequence[int]) -> list[bytes]:
        h = hashlib.blake2b(root.encode(), digest_size=16).digest()
        data = np.asarray(ids, dtype="<u4").tobytes()
        step = 4 * self.block
        out = []
        for i in range(len(ids) // self.block):
            h = hashlib.blake2b(h + data[i * step:(i + 1) * step], digest_size=16).digest()
            out.append(h)
        return out

    def lookup(self, root: str, ids: Sequence[int]) -> int:
        """Cached leading tokens of ``ids`` (a multiple of the block, < len(ids)); the hit
        blocks become most recently used."""
        hashes = self._hashes(root, ids[:max(len(ids) - 1, 0)])
        hits = 0
        for h in hashes:
            if h not in self._blocks:
                break
            hits += 1
        self._touch(hashes[:hits])
        return hits * self.block

    def _touch(self, hashes: Sequence[bytes]) -> None:
        # Most recent use goes to a sequence's head, so that its tail is evicted first and a
        # prefix stays usable (vLLM frees a request's blocks in reverse order for this reason).
        for h in reversed(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)

    def insert(self, root: str, ids: Sequence[int]) -> None:
        """Cache the full blocks of ``ids`` in order, evicting least recently used blocks of
        other sequences; a sequence never evicts its own blocks, so when it outgrows the memory
        its leading blocks (the prefix that fits) stay. Its head ends most recently used."""
        blocks = self._blocks
        hashes = self._hashes(root, ids)
        own = set(hashes)
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
                continue
            if len(blocks) >= self.capacity_blocks:
                victim = next(iter(blocks))  # own blocks were moved to the end: LRU is foreign
                if victim in own:
                    break
                del blocks[victim]
                self.evicted_blocks += 1
            blocks[h] = None
        self._touch(hashes)

    @property
    def used_tokens(self) -> int:
        """Tokens held (whole blocks)."""
        return len(self._blocks) * self.block


@dataclass
class Faults:
    """Faults the next requests meet: ``errors`` fail with HTTP 500, ``hangs`` sleep
    ``hang_s`` wall seconds first (a caller's timeout), each of the next ``slow`` runs
    ``slow_factor`` times slower."""

    errors: int = 0
    hangs: int = 0
    hang_s: float = 30.0
    slow: int = 0
    slow_factor: float = 10.0


@functools.lru_cache(maxsize=1 << 14)
def _ids(text: str, family: str) -> tuple[int, ...]:
    return tuple(encode(text, family))


def _text(message: dict) -> str:
    from carbonrouter_lib.serve.core import message_text

    return message_text(message)


class EngineEmulator:
    """One emulated deployment (see the module docstring).

    Parameters
    ----------
    spec
        The deployment (model, tokenizer, served model name).
    v_pre, v_dec
        Prefill and decode throughput, tokens/s (the deployment's profile).
    cache
        Its prefix cache (shared by the deployments of one pool in a cluster).
    scale
        Virtual seconds per wall second (``inf``: answer at once).
    """

    def __init__(self, spec: DeploymentSpec, v_pre: float, v_dec: float, cache: PrefixCache,
                 scale: float = 1.0) -> None:
        self.spec, self.v_pre, self.v_dec = spec, float(v_pre), float(v_dec)
        self.cache, self.scale = cache, float(scale)
        self.faults = Faults()
        self.requests = 0
        self.app = self._build()

    def _wall(self, virtual_s: float, slow: float) -> float:
        return 0.0 if math.isinf(self.scale) else virtual_s * slow / self.scale

    def _build(self) -> FastAPI:
        app = FastAPI(title=f"emulated engine {self.spec.id}")

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": self.spec.engine_model, "object": "model",
                                                "created": 0, "owned_by": "emulator"}]}

        @app.post("/emulator/faults")
        async def set_faults(request: Request) -> dict:
            body = await request.json()
            for k, v in body.items():
                if not hasattr(self.faults, k):
                    return JSONResponse({"error": f"unknown fault {k!r}"}, status_code=400)
                setattr(self.faults, k, type(getattr(self.faults, k))(v))
            return {"faults": vars(self.faults)}

        @app.get("/emulator/state")
        async def state() -> dict:
            return {"requests": self.requests, "cache_tokens": self.cache.used_tokens,
                    "evicted_blocks": self.cache.evicted_blocks}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self._chat(await request.json())

        return app

    async def _chat(self, body: dict[str, Any]):
        self.requests += 1
        f = self.faults
        if f.errors > 0:
            f.errors -= 1
            return JSONResponse({"error": {"message": "injected engine error",
                                           "type": "server_error"}}, status_code=500)
        if f.hangs > 0:
            f.hangs -= 1
            await asyncio.sleep(f.hang_s)
        slow = 1.0
        if f.slow > 0:
            f.slow -= 1
            slow = f.slow_factor
        fam, root = self.spec.family, self.spec.model
        prompt: list[int] = []
        for m in body.get("messages") or []:
            prompt.extend(_ids(_text(m), fam))
        cached = self.cache.lookup(root, prompt)
        self.cache.insert(root, prompt)  # prefill caches the prompt's blocks
        reply = (body.get("emulator") or {}).get("response")
        if reply is None:
            n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 32)
            seed = int.from_bytes(hashlib.blake2b(json.dumps(prompt[-64:]).encode(),
                                                  digest_size=4).digest(), "little")
            reply = " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(max(n, 1)))
        out = _ids(reply, fam)
        ttft = self._wall((len(prompt) - cached) / self.v_pre, slow)
        decode = self._wall(len(out) / self.v_dec, slow)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                 "total_tokens": len(prompt) + len(out),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        rid = "chatcmpl-" + hashlib.blake2b(f"{self.spec.id}{self.requests}".encode(),
                                            digest_size=8).hexdigest()
        created = int(time.time())
        model = self.spec.engine_model
        done = functools.partial(self.cache.insert, root, list(prompt) + list(out))
        if not body.get("stream"):
            await asyncio.sleep(ttft + decode)
            done()
            return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply}}],
                    "usage": usage}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(self._stream(rid, created, model, reply, ttft, decode, usage,
                                              include_usage, done),
                                 media_type="text/event-stream")

    async def _stream(self, rid: str, created: int, model: str, reply: str, ttft: float,
                      decode: float, usage: dict, include_usage: bool, done) -> Any:
        def event(choices: list, **extra: Any) -> str:
            doc = {"id": rid, "object": "chat.completion.chunk", "created": created,
                   "model": model, "choices": choices, **extra}
            return f"data: {json.dumps(doc)}\n\n"

        await asyncio.sleep(ttft)
        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
        words = reply.split(" ")
        pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
        step = max(1, len(pieces) // 8)  # about 8 chunks: the decode time spread over them
        chunks = ["".join(pieces[i:i + step]) for i in range(0, len(pieces), step)]
        for text in chunks:
            await asyncio.sleep(decode / len(chunks))
            yield event([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
        yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        done()
        if include_usage:
            yield event([], usage=usage)
        yield "data: [DONE]\n\n"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound and released at once)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


#: How long the servers we start keep an idle client connection open, s. Longer than any
#: client's own keep-alive (httpx, and so the ``openai`` client, drop idle connections after
#: 5 s): a server that closes first races a client sending on the connection it is closing,
#: and that request fails (seen as lost requests under load on a slow host).
SERVER_KEEP_ALIVE_S = 30.0


class ServerThread:
    """Serve ASGI apps on 127.0.0.1 ports from one background thread (one event loop).

    ``with ServerThread([(app, port), ...]):`` starts them and waits until every one listens;
    leaving the block stops them. No access log (no request line is written). Idle client
    connections are kept :data:`SERVER_KEEP_ALIVE_S`.
    """

    def __init__(self, apps: Sequence[tuple[Any, int]], host: str = "127.0.0.1") -> None:
        self._servers = [uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                       log_level="warning", access_log=False,
                                                       lifespan="on", loop="asyncio",
                                                       timeout_graceful_shutdown=1,
                                                       timeout_keep_alive=SERVER_KEEP_ALIVE_S))
                         for app, port in apps]
        for s in self._servers:
            s.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._run, daemon=True, name="carbonrouter-srv")
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.gather(*(s.serve() for s in self._servers)))

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start and wait until every server listens (``RuntimeError`` after ``timeout_s``)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not all(s.started for s in self._servers):
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("servers did not start (a port in use?)")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop every server and join the thread."""
        for s in self._servers:
            s.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class EmulatorCluster:
    """One :class:`EngineEmulator` per declared deployment of ``config``, each on the port of its
    ``base_url`` (which must be ``http://127.0.0.1:<port>/v1``); pools share cache memory.

    Parameters
    ----------
    config
        The serve configuration (profiles give each engine's v_pre and v_dec).
    scale
        Virtual seconds per wall second (``inf``: no sleeping).
    """

    def __init__(self, config: ServeConfig, scale: float = 1.0) -> None:
        grid, index = config.deployments_grid()
        caches: dict[tuple[str, str], PrefixCache] = {}
        self.engines: dict[str, EngineEmulator] = {}
        apps = []
        for a, spec in zip(index, config.deployments, strict=True):
            host, _, port = spec.base_url.split("//", 1)[1].split("/", 1)[0].partition(":")
            if host not in ("127.0.0.1", "localhost") or not port:
                raise ValueError(f"deployment {spec.id!r}: an emulated engine listens on "
                                 f"127.0.0.1:<port>, not {spec.base_url!r}")
            cache = caches.setdefault((spec.region, spec.gpu), PrefixCache(spec.kv_tokens))
            eng = EngineEmulator(spec, grid.v_pre[a], grid.v_dec[a], cache, scale)
            self.engines[spec.id] = eng
            apps.append((eng.app, int(port)))
        self.server = ServerThread(apps)

    def __enter__(self) -> EmulatorCluster:
        self.server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()
