"""`fucina serve [MODEL] [--host 127.0.0.1] [--port 8080] [--api-key KEY]`: the OpenAI-compatible server.

It listens on loopback unless told otherwise; any other address needs an API key (--api-key or
$FUCINA_API_KEY), since whoever reaches the port could use the model. The server is app/server.py on
uvicorn; the model runs in one engine service (engine/serving/service.py) whose slots keep their KV caches in
sidecars under the data dir, so conversations resent after a restart are warm.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

from app.cli.common import add_model_options, open_model, token_count
from app.server_requests import Limits
from engine.platform.catalog import default_model_name
from engine.errors import FucinaError
from engine.serving.service import DEFAULT_SLOTS, EngineService

DEFAULT_PORT = 8080
GRACEFUL_SHUTDOWN_S = 5


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def run_serve(args) -> int:
    api_key = args.api_key or os.environ.get("FUCINA_API_KEY") or None
    if not is_loopback(args.host) and not api_key:
        raise FucinaError(f"serving on {args.host} exposes the model to the network: give an API key "
                          "(--api-key KEY or FUCINA_API_KEY), or serve on 127.0.0.1")
    if not 0 <= args.port <= 65535:
        raise FucinaError(f"--port must be between 0 and 65535, got {args.port}")
    for flag, value in (("--slots", args.slots), ("--max-body", args.max_body)):
        if value < 1:
            raise FucinaError(f"{flag} must be at least 1, got {value}")
    import uvicorn  # the server stack loads only for this command

    from app.server import create_app

    name = args.model or default_model_name()
    model = open_model(args)
    service = EngineService(model, slots=args.slots, capacity=args.ctx, kv_dtype=args.kv)
    try:
        path = Path(model.file.path)
        # a starter model is served under its name, a file under its stem; either file name is an alias
        served = path.stem if name.endswith(".gguf") or os.sep in name else name
        app = create_app(service, [served, path.stem, path.name], api_key=api_key,
                         limits=Limits(max_body=args.max_body, max_tokens=args.ctx, speculation=not args.no_spec))
        resumed = sum(p > 0 for p in service.resumed_positions)
        print(f"fucina serve · {served} · http://{args.host}:{args.port}/v1 · {args.slots} slots of {args.ctx} "
              f"tokens{f' ({resumed} resumed warm)' if resumed else ''}{' · API key required' if api_key else ''}",
              file=sys.stderr, flush=True)
        # a stream still running when the server is stopped is cut after a few seconds, not waited for
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    finally:
        service.close()
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_model_options(p, optional=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on every request "
                   "(default: $FUCINA_API_KEY; none on loopback)")
    p.add_argument("--ctx", type=token_count, default=4096, help="context of each slot in tokens (default 4096)")
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                   help=f"conversations kept warm and decoded in turn (default {DEFAULT_SLOTS})")
    p.add_argument("--max-body", type=int, default=Limits.max_body,
                   help=f"largest request body in bytes (default {Limits.max_body})")
    p.add_argument("--no-spec", action="store_true",
                   help="decode plainly unless a request asks for speculation (default: speculative)")
    p.set_defaults(func=run_serve)
