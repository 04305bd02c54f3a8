"""Guest slices: a range of another tenant's layers for one micro-batch, run in an owner's gaps.

A *slice assignment* (:class:`SliceAssignment`, a lease of kind ``slice`` on the wire) names a
model (built-in family and seed, or a model directory), a layer range ``[start, end)``, the
compute unit that runs it and the micro-batch's input: token ids when the range starts at layer
0 (the embedding runs first), else the hidden states the previous slice produced. The range's
last layer being the model's last, the final norm and the head run after it and the output is
logits; otherwise it is the hidden states for the next slice. A micro-batch is a prefill (causal
attention, no KV cache): the arithmetic is :class:`~service.models.family.DecoderLM`'s, op for
op, so slices chained over the layers give the whole model's output (tested).

Where things live
    :class:`GuestLayers` materialises a guest's layer weights on its device once per
    ``(model, layers, device)`` on assignment (from the family and seed as every node builds
    them, or only those layers from the model's weight files) and releases every guest's weights
    on a device when the scheduler stops using it (:meth:`GuestLayers.release`). An assignment
    naming unknown layers, or needing more bytes than the device has free, is refused before
    anything is allocated. Activations between slices move by ``.to(device)`` within a node; a
    slice on another node's device runs through that node's stage server
    (:class:`~executor.remote.RemoteStage`, stateless, which keeps its own resident weights).

Sharing a compute unit
    :class:`ComputeUnitQueue` is one device's run queue: the owner's iterations first, guest
    slices in the gaps. A guest slice runs layer by layer; the queue starts a guest layer only
    when no owner iteration waits and the layer fits the gap's budget (``slice_budget_s``: its
    measured time so far, or the assignment's estimate, added to the gap's elapsed time), so an
    owner that becomes ready waits at most one slice budget (the first layer of a gap always
    runs: a budget smaller than one layer would starve the guest). A slice that does not finish
    in one gap continues in the next.

Streams
    On CUDA, guest work runs on a low-priority stream and the owner's on a high-priority one
    (:class:`StreamSelector`, its stream factory injectable: the priority choice is tested
    without a GPU). On the CPU there are no streams and both run inline.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from executor.device import torch_device
from executor.remote import RemoteStage
from service.domain.model_config import ModelConfig, model_config
from service.models.family import build_model, embed_inputs

Clock = Callable[[], float]
Role = Literal["owner", "guest"]
SLICE_KIND = "slice"  # the ``kind`` of a slice lease on the wire (a lease without one is a replica's)
DEFAULT_SLICE_BUDGET_S = 0.05  # an owner waits at most this long for a guest (one slice budget)


class SliceRefused(ValueError):
    """A slice assignment this executor cannot run (unknown layers or device, no room): nothing
    was allocated for it."""


# ---- the assignment --------------------------------------------------------------------------
@dataclass(frozen=True)
class SliceAssignment:
    """One guest slice: layers ``[start, end)`` of a model for one micro-batch, on ``device_id``.

    ``input_ids`` (``[B, T]`` token ids) when ``start == 0``; otherwise ``hidden`` (``[B, T, D]``,
    the previous slice's output, on any device: it is moved here). ``positions`` ``[B, T]``
    (default ``0..T-1`` per row). ``estimate_s``: the scheduler's predicted latency (0: none),
    which bounds the first layer's share of the gap before one is measured. ``url``: the stage
    server of the node owning ``device_id`` when that is not this node.
    """

    lease_id: str
    family: str
    start: int
    end: int
    device_id: str
    seed: int = 0
    path: str | None = None
    tenant_id: str = ""
    input_ids: Tensor | None = None
    hidden: Tensor | None = None
    positions: Tensor | None = None
    estimate_s: float = 0.0
    url: str | None = None

    @property
    def layers_key(self) -> LayersKey:
        return (self.family, self.seed, self.path, self.start, self.end, self.device_id)

    def tokens(self) -> tuple[int, int]:
        """The micro-batch's ``(batch, tokens)``."""
        x = self.input_ids if self.input_ids is not None else self.hidden
        if x is None:
            raise SliceRefused(f"slice {self.lease_id}: no input (input_ids or hidden)")
        return int(x.shape[0]), int(x.shape[1])

    def to_json(self) -> dict[str, Any]:
        """The lease as sent (hidden states travel as a nested list: a slice from another node
        carries them; within a node they move by ``.to()`` and never reach the wire)."""
        out: dict[str, Any] = {"kind": SLICE_KIND, "lease_id": self.lease_id, "family": self.family,
                               "seed": self.seed, "model_path": self.path, "tenant_id": self.tenant_id,
                               "layers": [self.start, self.end], "device_id": self.device_id,
                               "estimate_s": self.estimate_s}
        if self.input_ids is not None:
            out["input_ids"] = self.input_ids.tolist()
        if self.hidden is not None:
            out["hidden"] = self.hidden.float().cpu().tolist()
        if self.positions is not None:
            out["positions"] = self.positions.tolist()
        if self.url is not None:
            out["url"] = self.url
        return out

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> SliceAssignment:
        """Parse a slice lease; ``KeyError``, ``TypeError`` or ``ValueError`` (``SliceRefused``)
        when it is malformed."""
        if raw.get("kind") != SLICE_KIND:
            raise ValueError(f"not a slice lease (kind {raw.get('kind')!r})")
        start, end = (int(v) for v in raw["layers"])
        ids = torch.tensor(raw["input_ids"], dtype=torch.long) if raw.get("input_ids") is not None else None
        hidden = torch.tensor(raw["hidden"], dtype=torch.float32) if raw.get("hidden") is not None else None
        pos = torch.tensor(raw["positions"], dtype=torch.long) if raw.get("positions") is not None else None
        return SliceAssignment(str(raw["lease_id"]), str(raw["family"]), start, end, str(raw["device_id"]),
                               seed=int(raw.get("seed") or 0), path=str(raw["model_path"]) if raw.get("model_path")
                               else None, tenant_id=str(raw.get("tenant_id") or ""), input_ids=ids, hidden=hidden,
                               positions=pos, estimate_s=max(0.0, float(raw.get("estimate_s") or 0.0)),
                               url=str(raw["url"]) if raw.get("url") else None)


@dataclass(frozen=True)
class SliceObservation:
    """What running a slice measured: the observation the GMG keeps on its Slice node and the
    cost model trains on (seconds on the executor's clock; ``wait_s`` from assignment to its
    first layer)."""

    lease_id: str
    device_id: str
    family: str
    start: int
    end: int
    batch: int
    tokens: int
    latency_s: float  # the sum of its layer steps' durations (its compute, without the gaps between)
    wait_s: float
    gaps: int  # how many gaps it ran in

    def to_json(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id, "device_id": self.device_id, "family": self.family,
                "layers": [self.start, self.end], "batch": self.batch, "tokens": self.tokens,
                "latency_s": self.latency_s, "wait_s": self.wait_s, "gaps": self.gaps}


@dataclass
class SliceResult:
    """A finished slice: its output (hidden states, or logits after the model's last layer, on
    its device) and its observation."""

    assignment: SliceAssignment
    output: Tensor
    observation: SliceObservation


# ---- the layers --------------------------------------------------------------------------------
LayersKey = tuple[str, int, str | None, int, int, str]  # family, seed, path, start, end, device id


class SliceLayers(nn.Module):
    """Layers ``[start, end)`` of a model on one device, with the embedding when ``start == 0``
    and the final norm and head when ``end`` is the last layer (see the module docstring).

    :meth:`begin` starts a micro-batch; :meth:`advance` runs the next unit of it (one layer,
    the embedding folded into the first, the head into the last) so that a run queue can stop
    between layers.
    """

    def __init__(self, config: ModelConfig, blocks: nn.ModuleList, start: int, end: int, device: torch.device, *,
                 embed: nn.Module | None = None, pos_embed: nn.Module | None = None,
                 final_norm: nn.Module | None = None, lm_head: nn.Module | None = None) -> None:
        super().__init__()
        self.config, self.start, self.end, self.device = config, start, end, device
        self.blocks = blocks
        self.embed, self.pos_embed, self.final_norm, self.lm_head = embed, pos_embed, final_norm, lm_head
        if config.style == "llama":
            from service.models.family import rope_inv_freq

            self.register_buffer("inv_freq", rope_inv_freq(config, device), persistent=False)
        else:
            self.inv_freq = None

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def begin(self, assignment: SliceAssignment) -> SliceState:
        """The state of a micro-batch about to run here (inputs moved to this device)."""
        batch, tokens = assignment.tokens()
        positions = assignment.positions if assignment.positions is not None else \
            torch.arange(tokens).expand(batch, tokens)
        positions = positions.to(self.device)
        return SliceState(assignment, positions=positions, next_layer=self.start)

    @torch.inference_mode()
    def advance(self, state: SliceState) -> None:
        """Run the next layer of ``state`` (with the embedding before the first, the head after
        the last); ``state.done`` once every layer has run."""
        if state.done:
            raise ValueError("the slice has finished")
        a = state.assignment
        if state.x is None:  # the first unit: the inputs, embedded or moved here
            if self.start == 0:
                if a.input_ids is None or self.embed is None:
                    raise SliceRefused(f"slice {a.lease_id}: layer 0 needs input_ids")
                state.x, state.rope = embed_inputs(self.embed, self.pos_embed, self.inv_freq,
                                                   a.input_ids.to(self.device), state.positions)
            else:
                if a.hidden is None:
                    raise SliceRefused(f"slice {a.lease_id}: layers from {self.start} need the previous slice's hidden")
                dtype = next(self.blocks.parameters()).dtype
                state.x = a.hidden.to(self.device, dtype)
                state.rope = self._rope(state.positions, dtype)
        block = self.blocks[state.next_layer - self.start]
        state.x, _ = block(state.x, state.rope, None, None)
        state.next_layer += 1
        if state.done and self.lm_head is not None and self.final_norm is not None:
            state.x = self.lm_head(self.final_norm(state.x))

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """The rotary angles of ``positions`` (as :func:`embed_inputs` computes them), Llama only."""
        if self.inv_freq is None:
            return None
        freqs = positions.unsqueeze(-1).to(torch.float32) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def run(self, assignment: SliceAssignment) -> Tensor:
        """The whole slice at once (tests, and a slice that need not share its device)."""
        state = self.begin(assignment)
        while not state.done:
            self.advance(state)
        assert state.x is not None
        return state.x


def run_remote_slice(assignment: SliceAssignment, stage: RemoteStage | None = None) -> Tensor:
    """A blocks-only slice on another node's device (``assignment.url``), run by that node's
    stage server in one call (it holds the weights: nothing is allocated here); the output comes
    back on the input's device. ``stage``: an existing client to that server (tests)."""
    a = assignment
    config = model_config(a.family) if a.path is None else _hf_config(a.path)
    if a.start == 0 or a.end == config.n_layers or a.hidden is None:
        raise SliceRefused(f"slice {a.lease_id}: a remote slice runs blocks only, from the previous slice's hidden")
    if a.url is None and stage is None:
        raise SliceRefused(f"slice {a.lease_id}: a remote slice needs its node's stage server url")
    stage = stage or RemoteStage(str(a.url), a.family, a.seed, a.start, a.end, a.device_id, path=a.path)
    batch, tokens = a.tokens()
    positions = a.positions if a.positions is not None else torch.arange(tokens).expand(batch, tokens)
    rope = None
    if config.style == "llama":
        from service.models.family import rope_inv_freq

        freqs = positions.unsqueeze(-1).to(torch.float32) * rope_inv_freq(config, a.hidden.device)
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
        rope = (angles.cos().to(a.hidden.dtype), angles.sin().to(a.hidden.dtype))
    with torch.inference_mode():
        out: Tensor = stage(a.hidden, rope, None, None)[0]
    return out


def _hf_config(path: str) -> ModelConfig:
    from service.models.hf import hf_config

    return hf_config(path)


@dataclass
class SliceState:
    """A micro-batch partway through a slice's layers."""

    assignment: SliceAssignment
    positions: Tensor
    next_layer: int
    x: Tensor | None = None
    rope: tuple[Tensor, Tensor] | None = None
    layer_s: list[float] = field(default_factory=list)  # each layer step's measured duration
    gaps: int = 0
    assigned_s: float = 0.0
    first_step_s: float | None = None

    @property
    def done(self) -> bool:
        return self.next_layer >= self.assignment.end


Builder = Callable[[SliceAssignment, torch.device], SliceLayers]


def build_slice_layers(assignment: SliceAssignment, device: torch.device) -> SliceLayers:
    """The assignment's layers on ``device``: built from the family and seed (the whole model is
    initialised on the CPU, as every node does, and only these layers kept), or read from the
    model directory (these layers only, with the ends when the range needs them)."""
    a = assignment
    if a.path is not None:
        from service.models.hf import hf_config, load_model

        config = hf_config(a.path)
        ends = a.start == 0 or a.end == config.n_layers
        model = load_model(a.path, device=device, layers=range(a.start, a.end), ends=ends)
    else:
        config = model_config(a.family)
        model = build_model(config, seed=a.seed)
    last = a.end == config.n_layers
    head = model.lm_head
    if last and head.weight is model.embed.weight and a.start != 0:  # a tied head without its embedding
        head = nn.Linear(head.in_features, head.out_features, bias=False, dtype=head.weight.dtype)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
    layers = SliceLayers(config, nn.ModuleList(model.blocks[a.start:a.end]), a.start, a.end, device,
                         embed=model.embed if a.start == 0 else None,
                         pos_embed=model.pos_embed if a.start == 0 and config.style == "gpt2" else None,
                         final_norm=model.final_norm if last else None, lm_head=head if last else None)
    return layers.to(device).eval()


def layer_bytes(config: ModelConfig, start: int, end: int) -> int:
    """About the weights' bytes of layers ``[start, end)`` with the ends they carry (see
    :class:`SliceLayers`), from the config alone (checked before anything is allocated)."""
    d, kv = config.d_model, config.n_kv_heads * config.head_dim
    hidden = 2 * config.d_ff if config.style == "llama" else config.d_ff
    per_block = d * (d + 2 * kv) + d * d + hidden * d + config.d_ff * d + 4 * d
    elem = torch.empty((), dtype=getattr(torch, config.dtype)).element_size()
    total = (end - start) * per_block
    if start == 0:
        total += config.vocab_size * d + (config.max_seq_len * d if config.style == "gpt2" else 0)
    if end == config.n_layers:  # the final norm, and the head unless it is the embedding it carries (tied)
        total += d + (0 if config.tie_embeddings and start == 0 else config.vocab_size * d)
    return elem * total


class GuestLayers:
    """Guests' layer weights, materialised once per :data:`LayersKey` and released per device.

    ``capacity_bytes`` maps a device id to the bytes guests may hold there (absent: no limit);
    ``builder`` builds the layers (tests inject one that counts).
    """

    def __init__(self, *, capacity_bytes: Mapping[str, int] | None = None,
                 builder: Builder = build_slice_layers) -> None:
        self.capacity_bytes = dict(capacity_bytes or {})
        self._builder = builder
        self._layers: dict[LayersKey, SliceLayers] = {}
        self.materialised = 0  # how many times layers were built (a reused key builds nothing)
        self.released = 0

    def resident_bytes(self, device_id: str) -> int:
        return sum(layers.param_bytes() for key, layers in self._layers.items() if key[5] == device_id)

    def devices(self) -> set[str]:
        return {key[5] for key in self._layers}

    def check(self, assignment: SliceAssignment) -> ModelConfig:
        """Raise :class:`SliceRefused` unless the assignment can run here: a known model, layers
        inside it, an input that fits its first layer, a known device with room for its weights."""
        a = assignment
        try:
            if a.path is not None:
                from service.models.hf import hf_config

                config = hf_config(a.path)
            else:
                config = model_config(a.family)
        except Exception as exc:
            raise SliceRefused(f"slice {a.lease_id}: {exc}") from None
        if config.shape_only:
            raise SliceRefused(f"slice {a.lease_id}: {config.name} is shape-only (no weights to run)")
        if not 0 <= a.start < a.end <= config.n_layers:
            raise SliceRefused(f"slice {a.lease_id}: layers [{a.start}, {a.end}) outside {config.name}'s "
                               f"{config.n_layers}")
        if (a.input_ids is None) == (a.hidden is None) or (a.start == 0) != (a.input_ids is not None):
            raise SliceRefused(f"slice {a.lease_id}: layer 0 takes input_ids, a later layer the previous hidden")
        if a.hidden is not None and (a.hidden.dim() != 3 or a.hidden.shape[2] != config.d_model):
            raise SliceRefused(f"slice {a.lease_id}: hidden must be [batch, tokens, {config.d_model}]")
        if a.input_ids is not None and (a.input_ids.dim() != 2 or int(a.input_ids.min()) < 0
                                        or int(a.input_ids.max()) >= config.vocab_size):
            raise SliceRefused(f"slice {a.lease_id}: input_ids must be [batch, tokens] in [0, {config.vocab_size})")
        if a.tokens()[1] > config.max_seq_len:
            raise SliceRefused(f"slice {a.lease_id}: {a.tokens()[1]} tokens exceed {config.max_seq_len}")
        try:
            torch_device(a.device_id)
        except ValueError as exc:
            raise SliceRefused(f"slice {a.lease_id}: {exc}") from None
        if a.layers_key not in self._layers and a.device_id in self.capacity_bytes:
            need = layer_bytes(config, a.start, a.end)
            free = self.capacity_bytes[a.device_id] - self.resident_bytes(a.device_id)
            if need > free:
                raise SliceRefused(f"slice {a.lease_id}: its layers need {need} bytes, {a.device_id} has {free} free "
                                   "for guests")
        return config

    def materialise(self, assignment: SliceAssignment) -> SliceLayers:
        """The assignment's layers, built on first use (:meth:`check` first: a refusal allocates
        nothing)."""
        self.check(assignment)
        layers = self._layers.get(assignment.layers_key)
        if layers is None:
            layers = self._builder(assignment, torch_device(assignment.device_id))
            self._layers[assignment.layers_key] = layers
            self.materialised += 1
        return layers

    def release(self, device_id: str) -> int:
        """Drop every guest's weights on ``device_id`` (the scheduler no longer uses it for
        guests); returns how many layer sets were released."""
        keys = [k for k in self._layers if k[5] == device_id]
        for k in keys:
            del self._layers[k]
        self.released += len(keys)
        if keys:
            gc.collect()
            if device_id.startswith("cuda") and torch.cuda.is_available():
                torch.cuda.empty_cache()  # hand the freed blocks back, so the owner (or nvidia-smi) sees them
        return len(keys)


# ---- streams -----------------------------------------------------------------------------------
StreamFactory = Callable[[torch.device, int], Any]  # (device, priority) -> a stream


def cuda_stream(device: torch.device, priority: int) -> Any:
    return torch.cuda.Stream(device=device, priority=priority)  # type: ignore[no-untyped-call]


def cuda_priority_range() -> tuple[int, int]:
    """``(least, greatest)`` stream priorities (CUDA: a lower number is a higher priority)."""
    least, greatest = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]  # a static method
    return int(least), int(greatest)


class StreamSelector:
    """The stream a role's work runs on, per device: owners on the greatest priority, guests on
    the least (``priority_range``: ``(least, greatest)``, as CUDA reports it). One stream per
    ``(device, role)``, made on first use by ``factory``; on a non-CUDA device, none."""

    def __init__(self, *, factory: StreamFactory = cuda_stream,
                 priority_range: Callable[[], tuple[int, int]] = cuda_priority_range) -> None:
        self._factory = factory
        self._range = priority_range
        self._streams: dict[tuple[str, Role], Any] = {}

    def priority(self, role: Role) -> int:
        least, greatest = self._range()
        return greatest if role == "owner" else least

    def stream(self, device: torch.device, role: Role) -> Any | None:
        if device.type != "cuda":
            return None
        key = (str(device), role)
        if key not in self._streams:
            self._streams[key] = self._factory(device, self.priority(role))
        return self._streams[key]

    @contextlib.contextmanager
    def running(self, device: torch.device, role: Role) -> Iterator[Any | None]:
        """Work inside runs on the role's stream (CUDA), inline elsewhere."""
        stream = self.stream(device, role)
        if stream is None:
            yield None
            return
        with torch.cuda.stream(stream):
            yield stream


# ---- one compute unit's run queue -----------------------------------------------------------------
@dataclass
class _Guest:
    state: SliceState
    layers: SliceLayers


class ComputeUnitQueue:
    """One device's guest slices, run in its owner's gaps (see the module docstring).

    :meth:`run_gap` runs guest layers while ``owner_waiting()`` is false and the gap's budget
    allows, and returns the slices that finished. The owner runs its iterations itself, before
    calling it: owner first.
    """

    def __init__(self, device_id: str, *, slice_budget_s: float = DEFAULT_SLICE_BUDGET_S, clock: Clock = time.perf_counter,
                 streams: StreamSelector | None = None) -> None:
        if not slice_budget_s > 0:
            raise ValueError(f"slice_budget_s must be > 0, got {slice_budget_s}")
        self.device_id = device_id
        self.slice_budget_s = slice_budget_s
        self.clock = clock
        self.streams = streams or StreamSelector()
        self._guests: deque[_Guest] = deque()

    def __len__(self) -> int:
        return len(self._guests)

    def add(self, layers: SliceLayers, assignment: SliceAssignment) -> None:
        state = layers.begin(assignment)
        state.assigned_s = self.clock()
        self._guests.append(_Guest(state, layers))

    def lease_ids(self) -> list[str]:
        return [g.state.assignment.lease_id for g in self._guests]

    def drop(self, lease_id: str) -> bool:
        for g in self._guests:
            if g.state.assignment.lease_id == lease_id:
                self._guests.remove(g)
                return True
        return False

    def _expected_step_s(self, g: _Guest) -> float:
        """The next layer's expected duration: the longest measured so far, else the
        assignment's estimate spread over its layers (0 when it gave none)."""
        if g.state.layer_s:
            return max(g.state.layer_s)
        a = g.state.assignment
        return a.estimate_s / (a.end - a.start)

    def run_gap(self, owner_waiting: Callable[[], bool]) -> list[SliceResult]:
        """Guest layers in FIFO order of assignment until an owner waits or the budget is spent."""
        done: list[SliceResult] = []
        gap_start = self.clock()
        touched: set[int] = set()
        while self._guests and not owner_waiting():
            g = self._guests[0]
            elapsed = self.clock() - gap_start
            if elapsed > 0 and elapsed + self._expected_step_s(g) > self.slice_budget_s:
                break
            if elapsed >= self.slice_budget_s:
                break
            if id(g) not in touched:
                g.state.gaps += 1
                touched.add(id(g))
            step_start = self.clock()
            if g.state.first_step_s is None:
                g.state.first_step_s = step_start
            with self.streams.running(g.layers.device, "guest") as stream:
                g.layers.advance(g.state)
                if stream is not None:
                    stream.synchronize()  # its time is its own: measured to the end of its kernels
            g.state.layer_s.append(self.clock() - step_start)
            if g.state.done:
                self._guests.popleft()
                done.append(self._result(g))
        return done

    def _result(self, g: _Guest) -> SliceResult:
        s, a = g.state, g.state.assignment
        assert s.x is not None and s.first_step_s is not None
        batch, tokens = a.tokens()
        return SliceResult(a, s.x, SliceObservation(
            a.lease_id, self.device_id, a.family, a.start, a.end, batch, tokens, latency_s=math.fsum(s.layer_s),
            wait_s=s.first_step_s - s.assigned_s, gaps=s.gaps))
