"""Command line: ``python -m carbonrouter_lib.serve {demo,proxy,check}``.

- ``demo`` (``make serve``): emulated engines for every deployment of the configuration (default:
  the embedded ``default.yaml``) plus the proxy, all on 127.0.0.1, carbon replayed on the
  configured clock; prints how to point the ``openai`` client at it. ``--smoke N`` sends N
  conversations through it, prints their routes and exits.
- ``proxy``: the proxy alone, in front of the engines the file declares.
- ``check``: validate a configuration and print its deployments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

__all__ = ["main"]

_HOWTO = """\
carbonrouter proxy on http://{host}:{port}/v1  ({n} engines, policy {policy}, carbon {carbon})

    from openai import OpenAI
    client = OpenAI(base_url="http://{host}:{port}/v1", api_key="unused")
    r = client.chat.completions.with_raw_response.create(
        model="carbonrouter", messages=[{{"role": "user", "content": "Hello"}}],
        extra_headers={{"X-Session-ID": "my-conversation"}})
    print(r.headers["x-carbonrouter-deployment"], r.headers["x-carbonrouter-gco2e"])
    print(r.parse().choices[0].message.content)

metrics: http://{host}:{port}/metrics   health: http://{host}:{port}/healthz   (Ctrl-C stops)
"""


def _build(args: argparse.Namespace):
    from carbonrouter_lib.serve.config import load_config
    from carbonrouter_lib.serve.core import RouterCore
    from carbonrouter_lib.serve.proxy import create_app

    cfg = load_config(args.config)
    if getattr(args, "free_ports", False):
        from carbonrouter_lib.serve.emulator import free_ports

        ports = free_ports(len(cfg.deployments) + 1)
        cfg = cfg.on_loopback(ports[:-1], ports[-1])
    if args.port is not None:
        cfg = cfg.model_copy(update={"port": args.port})
    print(f"building the router ({cfg.router.policy}, gate {cfg.router.gate}) ...", flush=True)
    core = RouterCore(cfg)
    return cfg, core, create_app(core)


async def _smoke(cfg, n: int) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://{cfg.host}:{cfg.port}/v1", api_key="unused",
                         max_retries=0)
    for i in range(n):
        messages = [{"role": "user", "content": f"Conversation {i}: what is a KV cache?"}]
        for _ in range(3):
            r = await client.chat.completions.with_raw_response.create(
                model="carbonrouter", messages=messages, max_tokens=24,
                extra_headers={"X-Session-ID": f"smoke-{i}"})
            reply = r.parse().choices[0].message.content
            print(f"session smoke-{i} turn {len(messages) // 2}: "
                  f"{r.headers['x-carbonrouter-deployment']:<18} "
                  f"{float(r.headers['x-carbonrouter-gco2e']):.4f} gCO2e (est.)")
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "Tell me more."}]
    await client.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m carbonrouter_lib.serve")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, text in (("demo", "emulated engines + proxy on 127.0.0.1"),
                       ("proxy", "the proxy in front of the configured engines"),
                       ("check", "validate a configuration")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", default=None, help="YAML file (default: embedded demo)")
        if name != "check":
            p.add_argument("--port", type=int, default=None, help="override the proxy port")
        if name == "demo":
            p.add_argument("--smoke", type=int, default=0, metavar="N",
                           help="send N 3-turn conversations, print their routes, exit")
            p.add_argument("--free-ports", action="store_true",
                           help="engines and proxy on free 127.0.0.1 ports, not the file's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from carbonrouter_lib.serve.config import ConfigError, load_config

    try:
        if args.cmd == "check":
            cfg = load_config(args.config)
            for d in cfg.deployments:
                print(f"{d.id:<24} {d.model}/{d.gpu}/{d.region} zone {d.zone} -> {d.base_url}")
            return 0
        cfg, core, app = _build(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from carbonrouter_lib.serve.emulator import EmulatorCluster, ServerThread

    cluster = EmulatorCluster(cfg, scale=cfg.clock.scale) if args.cmd == "demo" else None
    proxy = ServerThread([(app, cfg.port)], host=cfg.host)
    try:
        if cluster is not None:
            cluster.__enter__()
        proxy.start()
        info = dict(host=cfg.host, port=cfg.port, n=len(cfg.deployments),
                    policy=core.policy.name, carbon=cfg.carbon.provider)
        print(_HOWTO.format(**info), flush=True)
        if args.cmd == "demo" and args.smoke:
            asyncio.run(_smoke(cfg, args.smoke))
            return 0
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        proxy.stop()
        if cluster is not None:
            cluster.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
