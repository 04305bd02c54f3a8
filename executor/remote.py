"""Stages on another node: activations move between executors over HTTP.

A placement may split a model's layers over devices of different executors. The executor
holding the lease (the *driver*) runs the embedding, its own stages and the head; for a stage
on another node it sends the stage's input activations over HTTP to that node's
:class:`StageServer`, which runs the stage's blocks on its device with the weights resident
there (built once per ``(family, seed, layers, device)`` from the same seed as everywhere, or,
for a model from disk, read once per ``(path, layers, device)``: only the stage's layers) and
answers with the output activations and the stage's new KV entries.

The driver keeps every stage's KV cache (a remote stage's cache lives in the driver's pool and
travels with each call): the remote side is stateless, so a lost or restarted node loses no
sequence state and a lease that fails over re-runs cleanly. The price is the cache's bytes on
the wire at every iteration, which is fine on loopback and small models and is what a
KV-resident protocol would remove.

Wire format: ``torch.save`` of a dict of tensors and plain values, read back with
``torch.load(weights_only=True)`` (no code is unpickled).
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import torch
from torch import Tensor, nn

from executor.device import torch_device
from service.domain.error import SliceschedError
from service.domain.model_config import model_config
from service.models.family import build_model
from service.models.hf import hf_config, load_model

log = logging.getLogger("slicesched.executor.remote")

PATH = "/v1/stage/forward"
MAX_BODY_BYTES = 512 << 20


def pack(obj: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unpack(data: bytes) -> dict[str, Any]:
    try:
        out = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors for a bad file
        raise ValueError(f"not a stage message: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(out, dict):
        raise ValueError("a stage message must be a dict")
    return out


class RemoteStage(nn.Module):
    """Blocks ``[start, end)`` of ``family`` (of the model directory ``path`` when given) run by
    the stage server at ``url`` on its ``device``.

    ``forward(x, rope, cache, bias) -> (x, new_kv)`` with ``new_kv`` stacked over the stage's
    layers, as a local stage returns them; tensors come back on the caller's device.
    ``last_compute_s``: the seconds the last call's layers ran on the server (its own clock,
    synchronised on CUDA; not the network or the wait for the node's owners), None before one.
    """

    def __init__(self, url: str, family: str, seed: int, start: int, end: int, device: str,
                 *, path: str | None = None, timeout_s: float = 60.0, yields: bool = False) -> None:
        super().__init__()
        self.url = url.rstrip("/") + PATH
        self.spec = {"family": family, "seed": seed, "start": start, "end": end, "device": device, "path": path,
                     "yields": yields}
        self._client = httpx.Client(timeout=timeout_s)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.last_compute_s: float | None = None

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, cache: Tensor | None,
                bias: Tensor | None) -> tuple[Tensor, Tensor]:
        body = pack({**self.spec, "x": x.cpu(), "rope": None if rope is None else [rope[0].cpu(), rope[1].cpu()],
                     "cache": None if cache is None else cache.cpu(), "bias": None if bias is None else bias.cpu()})
        response = self._client.post(self.url, content=body, headers={"content-type": "application/octet-stream"})
        if response.status_code != 200:
            raise RuntimeError(f"remote stage {self.url} answered {response.status_code}: {response.text[:200]}")
        self.bytes_sent += len(body)
        self.bytes_received += len(response.content)
        out = unpack(response.content)
        compute_s = out.get("compute_s")
        self.last_compute_s = float(compute_s) if isinstance(compute_s, (int, float)) and compute_s > 0 else None
        return out["x"].to(x.device), out["kv"].to(x.device)


class StageServer:
    """Serves this node's stages over HTTP on ``host:port`` (0: any free port), in threads.

    One forward at a time (the node's torch threads are its compute). ``url`` is what the
    executor registers so that drivers on other nodes can reach it. ``gate``: the node's worker
    holds it through each of its owners' iterations (:attr:`executor.worker.Worker.compute_lock`);
    a sliced guest's stage (``yields`` in the request) runs under it, so it waits for the owner's
    iteration in progress and an owner waits for at most that one stage. Other stages (a home
    replica's layers) never take it: two nodes' replicas calling each other's stages cannot
    deadlock.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 device_map: Callable[[str], torch.device] | None = None) -> None:
        self._device = device_map or torch_device
        self._blocks: dict[tuple[str, int, str | None, int, int, str], nn.ModuleList] = {}
        self._lock = threading.Lock()
        self.gate: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self.calls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != PATH:
                    self._reply(404, b"unknown path")
                    return
                length = int(self.headers.get("content-length") or 0)
                if not 0 < length <= MAX_BODY_BYTES:
                    self._reply(413, b"body missing or too large")
                    return
                try:
                    out = server.forward(unpack(self.rfile.read(length)))
                except (ValueError, KeyError, TypeError, RuntimeError, SliceschedError) as exc:
                    log.warning("stage request refused: %s", exc)
                    self._reply(400, str(exc).encode()[:500])
                    return
                self._reply(200, out)

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/octet-stream")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        self.url = f"http://{host}:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="stage-server", daemon=True)

    def start(self) -> StageServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def forward(self, msg: dict[str, Any]) -> bytes:
        family, seed = str(msg["family"]), int(msg["seed"])
        path = str(msg["path"]) if msg.get("path") else None
        start, end, device_id = int(msg["start"]), int(msg["end"]), str(msg["device"])
        device = self._device(device_id)
        blocks = self._stage(family, seed, path, start, end, device_id, device)
        x: Tensor = msg["x"].to(device)
        rope = None if msg["rope"] is None else (msg["rope"][0].to(device), msg["rope"][1].to(device))
        cache: Tensor | None = None if msg["cache"] is None else msg["cache"].to(device)
        bias: Tensor | None = None if msg["bias"] is None else msg["bias"].to(device)
        if cache is not None and cache.shape[0] != end - start:
            raise ValueError(f"cache has {cache.shape[0]} layers, the stage {end - start}")
        gate = self.gate if msg.get("yields") else contextlib.nullcontext()
        with gate, self._lock, torch.inference_mode():
            started = time.perf_counter()  # after the wait for the gate: the layers' own time
            kvs = []
            for i, block in enumerate(blocks):
                x, kv = block(x, rope, cache[i] if cache is not None else None, bias)
                kvs.append(kv)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            compute_s = time.perf_counter() - started
            self.calls += 1
        return pack({"x": x.cpu(), "kv": torch.stack(kvs).cpu(), "compute_s": compute_s})

    def _stage(self, family: str, seed: int, path: str | None, start: int, end: int, device_id: str,
               device: torch.device) -> nn.ModuleList:
        key = (family, seed, path, start, end, device_id)
        with self._lock:
            blocks = self._blocks.get(key)
            if blocks is None:
                config = hf_config(path) if path is not None else model_config(family)
                if not 0 <= start < end <= config.n_layers:
                    raise ValueError(f"layers [{start}, {end}) outside {config.name}'s {config.n_layers}")
                if path is not None:  # this stage's layers only, read straight onto the device
                    model = load_model(path, device=device, layers=range(start, end), ends=False)
                    blocks = nn.ModuleList(model.blocks[start:end]).eval()
                else:
                    model = build_model(config, seed=seed)
                    blocks = nn.ModuleList(model.blocks[start:end]).to(device).eval()
                self._blocks[key] = blocks
                log.info("stage server: %s (seed %d) layers [%d, %d) resident on %s", path or family, seed, start,
                         end, device_id)
        return blocks
