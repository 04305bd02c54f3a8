"""Guest slices on an executor: owner first, an owner waits at most one slice, weights once and
released, slices chained over the layers give the whole model's output."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from executor.remote import RemoteStage, StageServer
from executor.slices import (
    ComputeUnitQueue,
    GuestLayers,
    SliceAssignment,
    SliceLayers,
    SliceRefused,
    StreamSelector,
    build_slice_layers,
    layer_bytes,
    run_remote_slice,
)
from executor.worker import Lease, Worker
from service.domain.model_config import model_config
from service.models.family import build_model


def _ids(seed: int, batch: int = 2, tokens: int = 7) -> Tensor:
    return torch.randint(0, 256, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["tiny", "tiny-llama"])
def test_slices_chained_over_the_layers_give_the_whole_models_output(family: str) -> None:
    torch.set_num_threads(1)
    ids = _ids(1)
    whole, _ = build_model(model_config(family), seed=5)(ids, torch.arange(ids.shape[1])[None].expand_as(ids))
    first = SliceAssignment("s1", family, 0, 1, "cpu:0", seed=5, input_ids=ids)
    hidden = build_slice_layers(first, torch.device("cpu")).run(first)
    assert hidden.shape == (2, 7, model_config(family).d_model)
    second = SliceAssignment("s2", family, 1, 2, "cpu:1", seed=5, hidden=hidden.to(torch.device("cpu")))
    logits = build_slice_layers(second, torch.device("cpu")).run(second)
    torch.testing.assert_close(logits, whole)
    one = SliceAssignment("s3", family, 0, 2, "cpu:0", seed=5, input_ids=ids)  # the whole range in one slice
    torch.testing.assert_close(build_slice_layers(one, torch.device("cpu")).run(one), whole)


def test_a_slice_on_another_node_runs_through_its_stage_server() -> None:
    config = model_config("small-llama")  # 8 layers: a middle range is blocks only
    ids = _ids(2, batch=1, tokens=5)
    server = StageServer().start()
    try:
        head = SliceAssignment("a", "small-llama", 0, 3, "cpu:0", seed=2, input_ids=ids)
        hidden = build_slice_layers(head, torch.device("cpu")).run(head)
        middle = SliceAssignment("b", "small-llama", 3, 6, "cpu:1", seed=2, hidden=hidden, url=server.url)
        remote = run_remote_slice(middle)
        local = build_slice_layers(middle, torch.device("cpu")).run(middle)
        torch.testing.assert_close(remote, local)
        assert server.calls == 1
        with pytest.raises(SliceRefused):
            run_remote_slice(SliceAssignment("c", "small-llama", 0, 3, "cpu:1", seed=2, input_ids=ids,
                                             url=server.url))
    finally:
        server.close()
    assert config.n_layers == 8


class _Counting:
    def __init__(self) -> None:
        self.built: list[tuple[str, int, int]] = []

    def __call__(self, a: SliceAssignment, device: torch.device) -> SliceLayers:
        self.built.append((a.device_id, a.start, a.end))
        return build_slice_layers(a, device)


def test_a_guests_weights_are_materialised_once_and_released_with_the_device() -> None:
    builder = _Counting()
    layers = GuestLayers(builder=builder)
    a = SliceAssignment("x1", "tiny", 0, 1, "cpu:1", seed=3, input_ids=_ids(0))
    b = SliceAssignment("x2", "tiny", 0, 1, "cpu:1", seed=3, input_ids=_ids(1))  # same layers, another batch
    c = SliceAssignment("x3", "tiny", 1, 2, "cpu:2", seed=3, hidden=torch.zeros(1, 3, 192))
    assert layers.materialise(a) is layers.materialise(b)
    layers.materialise(c)
    assert builder.built == [("cpu:1", 0, 1), ("cpu:2", 1, 2)] and layers.materialised == 2
    assert layers.resident_bytes("cpu:1") > 0
    assert layers.release("cpu:1") == 1
    assert layers.resident_bytes("cpu:1") == 0 and layers.devices() == {"cpu:2"}
    layers.materialise(a)  # assigned again after a release: built again
    assert layers.materialised == 3


def test_the_layer_bytes_estimate_matches_the_built_layers() -> None:
    for family in ("tiny", "tiny-llama", "small-llama"):
        config = model_config(family)
        for start, end in ((0, 1), (1, config.n_layers), (0, config.n_layers)):
            ids = _ids(0) if start == 0 else None
            hidden = None if start == 0 else torch.zeros(1, 2, config.d_model)
            built = build_slice_layers(SliceAssignment("e", family, start, end, "cpu:0", input_ids=ids,
                                                       hidden=hidden), torch.device("cpu")).param_bytes()
            assert layer_bytes(config, start, end) == pytest.approx(built, rel=0.02), (family, start, end)


@pytest.mark.parametrize("bad", [
    dict(start=0, end=3),  # tiny has 2 layers
    dict(start=1, end=1),
    dict(family="no-such-model"),
    dict(family="llama2-7b", end=1),  # shape-only: no weights
    dict(device_id="tpu:0"),
    dict(device_id="cuda:63"),
    dict(device_id="cpu:7"),  # no room: 1 KiB for guests there
    dict(input_ids=None, hidden=torch.zeros(1, 2, 192)),  # layer 0 takes token ids
    dict(input_ids=torch.tensor([[1, 999]])),  # outside the vocabulary
])
def test_bad_slice_assignments_are_refused_with_nothing_allocated(bad: dict[str, Any]) -> None:
    builder = _Counting()
    worker = Worker(background_loads=False, slice_builder=builder, guest_capacity_bytes={"cpu:7": 1024})
    fields: dict[str, Any] = dict(lease_id="bad", family="tiny", start=0, end=1, device_id="cpu:0",
                                  input_ids=_ids(0))
    with pytest.raises(SliceRefused):
        worker.accept_slice(SliceAssignment(**{**fields, **bad}))
    assert builder.built == [] and not worker.busy
    assert worker.guest_layers.devices() == set()


def test_the_slice_lease_round_trips_through_json() -> None:
    a = SliceAssignment("L9", "tiny-llama", 1, 2, "cpu:1", seed=4, hidden=torch.ones(1, 2, 192),
                        positions=torch.tensor([[3, 4]]), estimate_s=0.01, tenant_id="acme")
    b = SliceAssignment.from_json(a.to_json())
    assert (b.lease_id, b.family, b.start, b.end, b.device_id, b.seed, b.estimate_s, b.tenant_id) == \
        ("L9", "tiny-llama", 1, 2, "cpu:1", 4, 0.01, "acme")
    assert b.hidden is not None and torch.equal(b.hidden, torch.ones(1, 2, 192))
    assert b.positions is not None and b.positions.tolist() == [[3, 4]]
    with pytest.raises(ValueError):
        SliceAssignment.from_json({**a.to_json(), "kind": "replica"})


# ---- the run queue on a scripted clock ------------------------------------------------------------
class _FakeLayers(SliceLayers):
    """Layers whose every step costs ``layer_s`` on a scripted clock and computes nothing."""

    def __init__(self, now: list[float], layer_s: float, n_layers: int) -> None:
        nn.Module.__init__(self)
        self.now, self.layer_s = now, layer_s
        self.start, self.end, self.device = 0, n_layers, torch.device("cpu")
        self.inv_freq = None

    def advance(self, state: Any) -> None:
        self.now[0] += self.layer_s
        state.x = torch.zeros(1)
        state.next_layer += 1


def _fake(lease_id: str, n_layers: int, estimate_s: float = 0.0) -> SliceAssignment:
    return SliceAssignment(lease_id, "tiny", 0, n_layers, "cpu:0", input_ids=torch.zeros(1, 4, dtype=torch.long),
                           estimate_s=estimate_s)


def test_the_owner_goes_first_and_guests_fill_the_gaps() -> None:
    now = [0.0]
    unit = ComputeUnitQueue("cpu:0", slice_budget_s=1.0, clock=lambda: now[0])
    unit.add(_FakeLayers(now, 0.25, 8), _fake("g", 8))
    assert unit.run_gap(lambda: True) == [] and now[0] == 0.0  # an owner waits: no guest layer runs
    assert unit.run_gap(lambda: False) == [] and now[0] == pytest.approx(1.0)  # one budget, then it yields
    ran = unit.run_gap(lambda: False)
    assert [r.assignment.lease_id for r in ran] == ["g"] and now[0] == pytest.approx(2.0)
    obs = ran[0].observation
    assert obs.latency_s == pytest.approx(2.0) and obs.gaps == 2 and (obs.batch, obs.tokens) == (1, 4)


def test_an_owner_waits_at_most_one_slice_budget_over_random_guest_loads() -> None:
    """An owner whose iterations become ready at random times beside guests of random sizes
    (each layer at most the budget): from the moment it is ready to the start of its
    iteration, measured on the executor's clock, it never waits longer than one slice budget."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        waits, finished, assigned = _owner_beside_random_guests(rng, budget_s=0.05)
        assert waits and max(waits) <= 0.05 + 1e-12
        assert finished == assigned  # every guest ran to its end in the gaps


def _owner_beside_random_guests(rng: np.random.Generator, budget_s: float) -> tuple[list[float], int, int]:
    """One run: the owner's waits, the guests finished and assigned."""
    now = [0.0]
    ready_at = [float(rng.uniform(0.0, 0.02))]
    unit = ComputeUnitQueue("cpu:0", slice_budget_s=budget_s, clock=lambda: now[0])
    assigned = int(rng.integers(1, 12))
    for i in range(assigned):
        layers = int(rng.integers(1, 16))
        unit.add(_FakeLayers(now, float(rng.uniform(0.001, budget_s)), layers), _fake(f"g{i}", layers))
    waits: list[float] = []
    finished = 0
    while len(unit) or ready_at[0] < 2.0:
        if now[0] >= ready_at[0]:  # the owner's iteration: owner first
            waits.append(now[0] - ready_at[0])
            now[0] += float(rng.uniform(0.001, 0.03))
            ready_at[0] = now[0] + float(rng.exponential(0.01))
            continue
        done = unit.run_gap(lambda: now[0] >= ready_at[0])
        finished += len(done)
        if not done and not len(unit):
            now[0] = ready_at[0]  # idle until the owner's next iteration
    return waits, finished, assigned


def test_a_slice_with_an_estimate_does_not_start_a_layer_past_the_budget() -> None:
    now = [0.0]
    unit = ComputeUnitQueue("cpu:0", slice_budget_s=1.0, clock=lambda: now[0])
    unit.add(_FakeLayers(now, 0.3, 2), _fake("a", 2))  # 0.6 s: ends at 0.6
    unit.add(_FakeLayers(now, 0.6, 2), _fake("b", 2, estimate_s=1.2))  # 0.6 s a layer: would end at 1.2
    done = unit.run_gap(lambda: False)
    assert [r.assignment.lease_id for r in done] == ["a"] and now[0] == pytest.approx(0.6)


# ---- streams ------------------------------------------------------------------------------------------
def test_owners_get_the_high_priority_stream_and_guests_the_low_one() -> None:
    made: list[tuple[str, int]] = []

    def factory(device: torch.device, priority: int) -> tuple[str, int]:
        made.append((str(device), priority))
        return (str(device), priority)

    streams = StreamSelector(factory=factory, priority_range=lambda: (0, -5))  # CUDA's: lower is higher
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert streams.priority("owner") == -5 and streams.priority("guest") == 0
    assert streams.stream(cuda0, "owner") == ("cuda:0", -5)
    assert streams.stream(cuda0, "guest") == ("cuda:0", 0)
    assert streams.stream(cuda0, "guest") == ("cuda:0", 0)  # one stream per device and role
    assert streams.stream(cuda1, "guest") == ("cuda:1", 0)
    assert made == [("cuda:0", -5), ("cuda:0", 0), ("cuda:1", 0)]
    assert streams.stream(torch.device("cpu"), "guest") is None  # no streams on the CPU
    with streams.running(torch.device("cpu"), "owner") as s:
        assert s is None
    assert len(made) == 3


# ---- the worker --------------------------------------------------------------------------------------
def _owner_lease(lease_id: str, max_tokens: int) -> dict[str, Any]:
    return {"lease_id": lease_id, "request_id": f"req-{lease_id}", "family": "tiny", "seed": 3,
            "replica_id": "globex/m@cpu:0", "stages": [{"device_id": "cpu:0", "layers": [0, 2]}],
            "prompt_tokens": [1, 2, 3], "max_tokens": max_tokens, "tpot_s": 1.0}


def test_the_worker_runs_owners_first_and_guest_slices_in_their_gaps() -> None:
    torch.set_num_threads(1)
    order: list[str] = []
    now = [0.0]

    class Recorded(SliceLayers):
        def advance(self, state: Any) -> None:
            order.append("guest")
            super().advance(state)

    def builder(a: SliceAssignment, device: torch.device) -> SliceLayers:
        layers = build_slice_layers(a, device)
        layers.__class__ = Recorded
        return layers

    worker = Worker(background_loads=False, clock=lambda: now[0], slice_builder=builder, slice_budget_s=10.0)
    assert worker.accept(Lease.from_json(_owner_lease("own", 3), 0.0))
    ids = _ids(4, batch=1, tokens=5)
    assert worker.accept_slice(SliceAssignment("gs", "tiny-llama", 0, 2, "cpu:0", seed=1, input_ids=ids))
    assert not worker.accept_slice(SliceAssignment("gs", "tiny-llama", 0, 2, "cpu:0", seed=1, input_ids=ids))
    batcher = next(iter(worker._batchers.values()))
    original = batcher.step

    def step() -> Any:
        order.append("owner")
        return original()

    batcher.step = step  # type: ignore[method-assign]
    result = worker.step_round()  # the owner first; its next iteration not yet due (pace: 0.5 s): a gap
    assert order == ["owner", "guest", "guest"]
    (done,) = result.slices
    whole, _ = build_model(model_config("tiny-llama"), seed=1)(ids, torch.arange(5)[None])
    torch.testing.assert_close(done.output, whole)
    assert done.observation.device_id == "cpu:0" and (done.observation.start, done.observation.end) == (0, 2)
    assert worker.guest_layers.devices() == {"cpu:0"}
    assert worker.release_guests("cpu:0") == [] and worker.guest_layers.devices() == set()


def test_a_guest_slice_waits_while_its_devices_owner_is_pressed() -> None:
    """Two requests in an owner's two KV slots (a full batch is always due): no gap until the
    owner's batch is done; a slice on another device runs meanwhile."""
    now = [0.0]
    worker = Worker(max_batch=2, background_loads=False, clock=lambda: now[0])
    for lid in ("o1", "o2"):
        assert worker.accept(Lease.from_json(_owner_lease(lid, 4), 0.0))
    worker.accept_slice(SliceAssignment("here", "tiny", 0, 1, "cpu:0", input_ids=_ids(0)))
    worker.accept_slice(SliceAssignment("there", "tiny", 0, 1, "cpu:1", input_ids=_ids(1)))
    owners_done: set[str] = set()
    slices_done: list[str] = []
    while worker.busy:
        result = worker.step_round()
        owners_done |= {c.lease_id for _, c in result.completed}
        for r in result.slices:
            assert r.assignment.lease_id != "here" or owners_done == {"o1", "o2"}
            slices_done.append(r.assignment.lease_id)
    assert slices_done == ["there", "here"]


def test_released_guests_fail_their_queued_slices() -> None:
    worker = Worker(background_loads=False)
    worker.accept_slice(SliceAssignment("q1", "tiny", 0, 1, "cpu:1", input_ids=_ids(0)))
    assert worker.busy
    (failure,) = worker.release_guests("cpu:1")
    assert failure.lease_id == "q1" and not worker.busy


def _sliced_lease(lease_id: str, max_tokens: int) -> dict[str, Any]:
    """A sliced guest's lease (placement ``slice``): another tenant's model, yielding to owners."""
    return {**_owner_lease(lease_id, max_tokens), "request_id": f"req-{lease_id}", "seed": 9, "guest": True,
            "yields": True, "replica_id": "acme/m@cpu:0:0-1+cpu:0:1-2",
            "stages": [{"device_id": "cpu:0", "layers": [0, 1]}, {"device_id": "cpu:0", "layers": [1, 2]}]}


def test_a_sliced_guest_replica_runs_only_while_no_owner_is_due() -> None:
    """An owner with a full batch is always due: the sliced guest's iterations wait until the
    owner's requests are done; a whole guest (no ``yields``) shares the time meanwhile."""
    now = [0.0]
    worker = Worker(max_batch=2, background_loads=False, clock=lambda: now[0])
    for lid in ("o1", "o2"):
        assert worker.accept(Lease.from_json(_owner_lease(lid, 4), 0.0))
    sliced = Lease.from_json(_sliced_lease("s1", 3), 0.0)
    assert sliced.yields and all(s.yields for s in sliced.stages)
    assert worker.accept(sliced)
    whole = Lease.from_json({**_sliced_lease("w1", 3), "yields": False, "replica_id": "initech/m@cpu:0",
                             "stages": [{"device_id": "cpu:0", "layers": [0, 2]}]}, 0.0)
    assert worker.accept(whole)
    finished: list[str] = []
    while worker.busy:
        result = worker.step_round()
        now[0] += 0.01
        finished += [c.lease_id for _, c in result.completed]
    assert finished.index("s1") > max(finished.index("o1"), finished.index("o2"))
    assert finished.index("w1") < finished.index("s1")


def test_a_yielding_stage_on_another_node_waits_for_its_owners_iteration() -> None:
    """The stage server runs a sliced guest's layers under the node's compute lock (held by its
    worker through each owner iteration); a home replica's stage never takes it."""
    server = StageServer().start()
    try:
        gate = threading.Lock()
        server.gate = gate
        x = torch.randn(1, 3, model_config("tiny").d_model)
        guest = RemoteStage(server.url, "tiny", 2, 0, 1, "cpu:0", yields=True)
        home = RemoteStage(server.url, "tiny", 2, 1, 2, "cpu:0")
        with gate:  # an owner's iteration in progress
            home(x, None, None, None)  # not gated: runs now
            waiting = threading.Thread(target=guest, args=(x, None, None, None))
            waiting.start()
            waiting.join(0.5)
            assert waiting.is_alive() and server.calls == 1
        waiting.join(10)
        assert not waiting.is_alive() and server.calls == 2
    finally:
        server.close()
