"""openai_e2e: what do the OpenAI endpoint and its streaming cost against the native endpoint, on one live setup?

Real processes on loopback: ``slicesched serve`` on a private Neo4j and one executor daemon (one
CPU device, one torch thread) running a built-in model (``--family``). The same closed-loop
workload runs through both endpoints: ``--concurrency`` clients, each sending its requests one
after another (``--requests`` in all, distinct prompts, ``--max-tokens`` greedy tokens each):

- native: ``POST /v1/requests``, then ``GET /v1/requests/{id}`` every ``--poll-ms`` until done;
- openai: ``POST /v1/completions`` with ``stream: true``, read to ``data: [DONE]``.

Both clients are plain ``httpx`` (the same cost on the client side; the official ``openai``
client is exercised by tests/api/test_openai.py). After a warm-up round of each, the endpoints
alternate (which goes first alternates too) over ``--repeats`` rounds. Per endpoint: output
tokens per second (first submission to last answer, wall clock), client-side TTFT (the first
token the client holds: the first streamed token; the finished result for the native endpoint)
and the service's recorded TTFT, medians over rounds. ``results.overhead`` = 1 -
openai tokens/s / native tokens/s (medians); target ``overhead <= 0.05``. The streamed tokens
are checked against the native results (greedy: the same).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

TARGET_OVERHEAD = 0.05


async def native_one(c: Any, prompt: str, max_tokens: int, poll_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = await c.post("/v1/requests", json={"model_id": "m", "prompt": prompt, "max_tokens": max_tokens})
    r.raise_for_status()
    rid = r.json()["request_id"]
    while True:
        await asyncio.sleep(poll_s)
        got = (await c.get(f"/v1/requests/{rid}")).json()
        if got["status"] == "done":
            done = time.perf_counter() - t0
            return {"tokens": got["output_tokens"], "ttft_client_s": done, "ttft_service_s": got["ttft_s"]}
        if got["status"] in ("cancelled", "failed"):
            raise RuntimeError(f"request {rid} {got['status']}: {got['error']}")


async def openai_one(c: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    tokens: list[int] = []
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "return_token_ids": True}
    async with c.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        rid = r.headers["x-request-id"]
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
            if ids and first is None:
                first = time.perf_counter() - t0
            tokens.extend(ids)
    return {"tokens": tokens, "ttft_client_s": first, "request_id": rid}


async def run_round(url: str, key: str, admin_key: str, endpoint: str, args: Any) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=args.concurrency + 2)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300.0, limits=limits) as c, \
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60.0) as admin:
        queue = list(range(args.requests))
        results: dict[int, dict[str, Any]] = {}

        async def client() -> None:
            while queue:
                i = queue.pop(0)
                prompt = f"request {i}: tell me about slices"
                results[i] = (await native_one(c, prompt, args.max_tokens, args.poll_ms / 1e3) if endpoint == "native"
                              else await openai_one(c, prompt, args.max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0
        for r in results.values():  # the service's record of a streamed request, after the clock
            if "request_id" in r:
                r["ttft_service_s"] = (await admin.get(f"/v1/requests/{r['request_id']}")).json()["ttft_s"]
    tokens = sum(len(r["tokens"]) for r in results.values())
    return {"tokens_per_s": tokens / wall, "wall_s": wall, "output_tokens": tokens,
            "ttft_client_s": statistics.median(r["ttft_client_s"] for r in results.values()),
            "ttft_service_s": statistics.median(r["ttft_service_s"] for r in results.values()),
            "by_request": {i: r["tokens"] for i, r in results.items()}}


async def measure(url: str, admin_key: str, args: Any) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=120.0) as c:
        key = (await c.post("/v1/tenants", json={"tenant_id": "bench"})).json()["api_key"]
        (await c.post("/v1/catalog/models", json={"model_id": "m", "family": args.family, "tenant_id": "bench"}
                      )).raise_for_status()
    rounds: dict[str, list[dict[str, Any]]] = {"native": [], "openai": []}
    loads = [os.getloadavg()[0]]
    for r in range(-1, args.repeats):  # round -1: warm-up of each, not counted
        order = ("native", "openai") if r % 2 == 0 else ("openai", "native")
        for endpoint in order:
            got = await run_round(url, key, admin_key, endpoint, args)
            loads.append(os.getloadavg()[0])
            print(f"  round {r}: {endpoint:6s} {got['tokens_per_s']:7.1f} tok/s, ttft client "
                  f"{1e3 * got['ttft_client_s']:.0f} ms (service {1e3 * got['ttft_service_s']:.0f} ms)", flush=True)
            if r >= 0:
                rounds[endpoint].append(got)
    agree = all(a["by_request"] == b["by_request"] for a, b in zip(rounds["native"], rounds["openai"], strict=True))
    summary: dict[str, Any] = {}
    for endpoint, measured in rounds.items():
        summary[endpoint] = {
            "tokens_per_s": statistics.median(g["tokens_per_s"] for g in measured),
            "tokens_per_s_rounds": [round(g["tokens_per_s"], 1) for g in measured],
            "ttft_client_s": statistics.median(g["ttft_client_s"] for g in measured),
            "ttft_service_s": statistics.median(g["ttft_service_s"] for g in measured),
            "wall_s": statistics.median(g["wall_s"] for g in measured)}
    overhead = 1.0 - summary["openai"]["tokens_per_s"] / summary["native"]["tokens_per_s"]
    pairs = [1.0 - o["tokens_per_s"] / n["tokens_per_s"] for n, o in zip(rounds["native"], rounds["openai"], strict=True)]
    return {**summary, "overhead": overhead, "overhead_rounds": [round(x, 4) for x in pairs],
            "tokens_agree": agree, "load_avg_1m": {"min": min(loads), "max": max(loads)},
            "target": {"overhead": TARGET_OVERHEAD, "met": overhead <= TARGET_OVERHEAD}}


def main() -> int:
    p = _record.parser("openai_e2e", __doc__.splitlines()[0])
    p.add_argument("--family", default="tiny", help="the built-in model served")
    p.add_argument("--concurrency", type=int, default=8, help="clients at once (the replica's KV slots: 8)")
    p.add_argument("--requests", type=int, default=64, help="requests per round, per endpoint")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="measured rounds per endpoint, interleaved")
    p.add_argument("--poll-ms", type=float, default=20.0, help="the native client's polling interval")
    p.add_argument("--log-dir", type=Path, help="keep the service's and the executor's logs here")
    args = p.parse_args()
    if args.quick:
        args.requests, args.repeats, args.max_tokens = 24, 2, 48

    from service.harness.stack import LiveStack

    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    with LiveStack(log_dir=args.log_dir) as stack:
        stack.start_executor("e1", ["cpu:0"])
        stack.wait_devices(1)
        print(f"service at {stack.url}; one executor (cpu:0), model {args.family}", flush=True)
        results = asyncio.run(measure(stack.url, stack.admin_key, args))
    print(f"  overhead {100 * results['overhead']:.1f}% (target <= {100 * TARGET_OVERHEAD:.0f}%)", flush=True)
    _record.write("openai_e2e", args, {"family": args.family, "concurrency": args.concurrency,
                                       "requests": args.requests, "max_tokens": args.max_tokens,
                                       "repeats": args.repeats, "poll_ms": args.poll_ms, "executors": 1,
                                       "devices": ["cpu:0"]}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
