"""A workflow's tool call as a process of its own on a CPU core: ``python -m executor.tool
--tool NAME --seconds S --output-tokens N``.

The work is real CPU work for ``S`` seconds (a SHA-256 chain, the stand-in for code execution,
retrieval or image preprocessing, whose duration a workflow declares); the answer, one JSON line
on stdout, carries the tool's name, the CPU and wall seconds it took, the chain's digest and an
output text of ``N`` characters (what later steps read: one byte-level token each). The service
starts one process per call (at most one per core at a time) and kills it when the workflow is
cancelled. Standard library only, so that it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

MAX_SECONDS = 600.0
MAX_OUTPUT_TOKENS = 100_000


def run(tool: str, seconds: float, output_tokens: int) -> dict[str, object]:
    wall0, cpu0 = time.monotonic(), time.process_time()
    digest = hashlib.sha256(tool.encode()).digest()
    rounds = 0
    while time.monotonic() - wall0 < seconds:
        for _ in range(2000):
            digest = hashlib.sha256(digest).digest()
        rounds += 2000
    hexdigest = digest.hex()
    words = f"{tool} result {hexdigest} "
    output = (words * (output_tokens // len(words) + 1))[:output_tokens]
    return {"tool": tool, "wall_s": time.monotonic() - wall0, "cpu_s": time.process_time() - cpu0,
            "rounds": rounds, "digest": hexdigest, "output": output}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m executor.tool", description="one workflow tool call")
    p.add_argument("--tool", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--output-tokens", type=int, default=0)
    args = p.parse_args(argv)
    if not 0.0 <= args.seconds <= MAX_SECONDS or not 0 <= args.output_tokens <= MAX_OUTPUT_TOKENS:
        print(f"error: --seconds in [0, {MAX_SECONDS:g}] and --output-tokens in [0, {MAX_OUTPUT_TOKENS}]",
              file=sys.stderr)
        return 2
    print(json.dumps(run(args.tool, args.seconds, args.output_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
