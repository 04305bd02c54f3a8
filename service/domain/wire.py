"""The executor protocol's JSON shapes, shared by the service and the executor (docs/API.md).

Both sides build and read these: the service sends a :class:`LeaseGrant` from the long poll and
takes back :class:`Completion` and :class:`Failure`; the executor sends :class:`Poll`,
:class:`Heartbeat` and (for streaming leases) :class:`ProgressUpdate` bodies. ``to_json`` gives
the body as sent; ``from_json`` parses one and raises ``KeyError``, ``TypeError`` or
``ValueError`` when it is malformed. The service's pydantic bodies (``service/api/schemas.py``)
add the HTTP bounds on the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from service.domain.sampling import GREEDY, Sampling


@dataclass(frozen=True)
class WireStage:
    """Layers ``[start, end)`` of a lease's model on one device, named as its executor knows it;
    ``url``: the stage server of the executor owning the device, when that is not the lease's."""

    device_id: str  # the owning executor's name for it ("cpu:0")
    start: int
    end: int
    url: str | None = None
    global_device_id: str | None = None  # "<executor_id>/<device_id>", the service's name

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device_id": self.device_id, "global_device_id": self.global_device_id,
                               "layers": [self.start, self.end]}
        if self.url is not None:
            out["url"] = self.url
        return out

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> WireStage:
        start, end = raw["layers"]
        url, global_id = raw.get("url"), raw.get("global_device_id")
        return WireStage(str(raw["device_id"]), int(start), int(end), str(url) if url else None,
                         str(global_id) if global_id else None)


@dataclass(frozen=True)
class LeaseGrant:
    """One request to run on one placement, as the long poll hands it to an executor."""

    lease_id: str
    request_id: str
    replica_id: str
    family: str
    seed: int
    stages: tuple[WireStage, ...]  # in layer order; the first is on the executor holding the lease
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    tenant_id: str = ""
    model_id: str = ""
    expires_in_s: float = 0.0  # the lease's lifetime unless renewed (heartbeats renew it)
    model_path: str | None = None  # a model directory on the executors' nodes; None: the built-in family
    sampling: Sampling = GREEDY  # how the next token is chosen (service.domain.sampling)
    stop_ids: tuple[int, ...] = ()  # producing one of these ends the request early
    stream: bool = False  # report tokens as they come (POST /v1/leases/progress)
    guest: bool = False  # its replica is a guest on these devices: their owners' work comes first
    tpot_s: float = 0.0  # the request's time-per-output-token target (0: none given)
    # a sliced guest under owner priority (placement ``slice``): its iterations run only in the
    # gaps of its devices' owners, and its layers on another node wait for that node's owners
    yields: bool = False

    def to_json(self) -> dict[str, Any]:
        """The lease as sent; sampling (when not greedy), stop ids, streaming, guest and the TPOT
        target only when they apply (the long poll's hot path stays as lean as a greedy lease needs)."""
        out = {"lease_id": self.lease_id, "request_id": self.request_id, "tenant_id": self.tenant_id,
               "model_id": self.model_id, "family": self.family, "seed": self.seed, "replica_id": self.replica_id,
               "stages": [s.to_json() for s in self.stages], "prompt_tokens": list(self.prompt_tokens),
               "max_tokens": self.max_tokens, "expires_in_s": self.expires_in_s, "model_path": self.model_path}
        if not self.sampling.greedy:
            out.update(temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                       sampling_seed=self.sampling.seed)
        if self.stop_ids:
            out["stop_ids"] = list(self.stop_ids)
        if self.stream:
            out["stream"] = True
        if self.guest:
            out["guest"] = True
        if self.tpot_s > 0:
            out["tpot_s"] = self.tpot_s
        if self.yields:
            out["yields"] = True
        return out

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> LeaseGrant:
        """A missing or null ``seed`` is 0 (``build_model``'s default); the fields an executor
        does not need to run the lease (tenant, model, lifetime) may be missing, and so may
        ``model_path`` (a built-in model); missing sampling fields mean greedy, no stop ids, no
        streaming. A sampling parameter out of its range is an
        :class:`~service.domain.error.InvalidInputError`."""
        return LeaseGrant(
            lease_id=str(raw["lease_id"]),
            request_id=str(raw["request_id"]),
            replica_id=str(raw["replica_id"]),
            family=str(raw["family"]),
            seed=int(raw.get("seed") or 0),
            stages=tuple(WireStage.from_json(s) for s in raw["stages"]),
            prompt_tokens=tuple(int(t) for t in raw["prompt_tokens"]),
            max_tokens=int(raw["max_tokens"]),
            tenant_id=str(raw.get("tenant_id") or ""),
            model_id=str(raw.get("model_id") or ""),
            expires_in_s=float(raw.get("expires_in_s") or 0.0),
            model_path=str(raw["model_path"]) if raw.get("model_path") else None,
            sampling=Sampling(float(raw["temperature"]), float(raw.get("top_p") or 1.0),
                              int(raw.get("sampling_seed") or 0)) if raw.get("temperature") else GREEDY,
            stop_ids=tuple(int(t) for t in raw.get("stop_ids") or ()),
            stream=bool(raw.get("stream", False)),
            guest=bool(raw.get("guest", False)),
            tpot_s=max(0.0, float(raw.get("tpot_s") or 0.0)),
            yields=bool(raw.get("yields", False)),
        )


@dataclass(frozen=True)
class Completion:
    """The result of a finished lease (times in seconds from the executor's receipt of it)."""

    lease_id: str
    output_tokens: list[int]
    queued_s: float  # received -> admitted into the batch
    ttft_s: float  # received -> first token
    e2e_s: float  # received -> last token
    iterations: int
    busy_s: float  # sum of the durations of the iterations the request took part in
    peak_bytes: int
    # Its prefill's seconds per stage of the lease, in the lease's stage order (a stage on another
    # node: the time its stage server reports; ``None``: a stage not timed): what the GMG keeps as
    # slice observations.
    prefill_stage_s: tuple[float | None, ...] = ()
    # One decode iteration it took part in, per stage likewise (empty: none timed), with that
    # iteration's sequences and the longest context it attended.
    decode_stage_s: tuple[float | None, ...] = ()
    decode_batch: int = 0
    decode_context: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_stage_s", "decode_stage_s"):  # a list from JSON, kept as a tuple
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["prefill_stage_s"] = list(self.prefill_stage_s)
        out["decode_stage_s"] = list(self.decode_stage_s)
        return out


@dataclass(frozen=True)
class Failure:
    """A lease its executor cannot run; the service puts its request back in the queue (or,
    out of attempts, fails it). Posted to ``/v1/leases/{lease_id}/fail``."""

    lease_id: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason}


@dataclass(frozen=True)
class ProgressUpdate:
    """New tokens of a streaming lease: ``tokens`` are its output from position ``offset`` on
    (positions are absolute, so a repeated or re-leased run's tokens are recognised)."""

    lease_id: str
    offset: int
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id, "offset": self.offset, "tokens": list(self.tokens)}


@dataclass(frozen=True)
class Poll:
    """The long poll's body: up to ``max_leases`` leases, waiting up to ``wait_s`` for work.
    ``ready``: the replicas the executor has built (model loaded, KV pool allocated); the
    service leases a replica not among them one request at a time until it is (``None``: the
    executor does not say, no limit)."""

    executor_id: str
    max_leases: int
    wait_s: float
    ready: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        if self.ready is None:
            del body["ready"]
        else:
            body["ready"] = list(self.ready)
        return body


@dataclass(frozen=True)
class Heartbeat:
    """The leases an executor holds (running, or finished with the completion not yet
    accepted) and its total busy seconds."""

    running: tuple[str, ...]
    busy_s: float

    def to_json(self) -> dict[str, Any]:
        return {"running": list(self.running), "busy_s": self.busy_s}
