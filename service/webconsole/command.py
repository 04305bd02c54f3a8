"""``slicesched console``: the web console under uvicorn, calling the API at ``--api``."""

from __future__ import annotations

import argparse
import sys

from service.domain.error import EXIT_BAD_INPUT


def console_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slicesched console",
                                description="run the web console: pages for people, calling the scheduling API "
                                            "with the signed-in user's key")
    p.add_argument("--api", default="http://127.0.0.1:8000", help="the slicesched API's URL (default %(default)s)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--secure-cookies", action="store_true",
                   help="mark the session cookie Secure (when the console is served over HTTPS)")
    p.add_argument("--session-idle-s", type=float, default=1800.0, help="a session ends after this long idle")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if not args.api.startswith(("http://", "https://")):
        print(f"error: --api must be an http(s) URL, got {args.api!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.session_idle_s <= 0:
        print("error: --session-idle-s must be above 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    import uvicorn

    from service.webconsole.app import create_console

    print(f"slicesched console on http://{args.host}:{args.port} (API {args.api}); sign in with an API key",
          file=sys.stderr, flush=True)
    uvicorn.run(create_console(args.api, secure_cookies=args.secure_cookies, session_idle_s=args.session_idle_s),
                host=args.host, port=args.port, log_level=args.log_level, access_log=args.log_level == "debug",
                timeout_graceful_shutdown=3)
    return 0
