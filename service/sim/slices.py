"""Placed slices and link transfers of a simulated cluster (a part of
:class:`~service.sim.cluster.SimulatedCluster`): a slice holds its memory from commit to
finish and its device window; its inputs move first, first come first served per link."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from service.core.cost import CostModel, OpFeatures
from service.core.memory import MemoryLedger
from service.domain.cluster import ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.sim.engine import Engine, Event, SliceFinished, TransferFinished
from service.sim.report import SimObserver
from service.sim.resource import PlacedSlice, Placement, SliceSpec, SliceTiming, TransferTiming
from service.sim.state import SimState


class PlacedSlices:
    spec: ClusterSpec
    state: SimState
    engine: Engine
    cost_model: CostModel
    _devices: dict[str, Device]
    _observers: list[SimObserver]

    # provided by the cluster: freed memory may let an idle replica on these devices admit
    _wake_idle: Callable[[Iterable[str], float], list[Event]]

    @property
    def ledger(self) -> MemoryLedger:
        return self.state.ledger

    def slice_duration_s(self, ops: Sequence[OpFeatures], device_id: str) -> float:
        return self.cost_model.predict(ops, self._devices[device_id]).p50_s

    def commit(self, slice_spec: SliceSpec, placement: Placement) -> SliceTiming:
        """Place a slice now: move its inputs (FIFO on the link), hold its memory (forced:
        a violation is recorded if it does not fit) and reserve its device window."""
        st = self.state
        now = self.engine.now_s
        dev = placement.device_id
        if slice_spec.slice_id in st.slice_timings:
            raise InvalidInputError(f"slice {slice_spec.slice_id!r} already placed", culprit=slice_spec.slice_id)
        if dev not in self._devices:
            raise InvalidInputError(f"unknown device {dev!r}", culprit=dev)
        allocs = [st.ledger.overflow(dev, "activation", slice_spec.slice_id, slice_spec.resident_bytes, at_s=now)]
        ready = now
        src = slice_spec.input_device_id
        if slice_spec.input_bytes and src is not None and src != dev:
            tt = self.transfer(src, dev, slice_spec.input_bytes)
            ready = tt.arrival_s
            allocs.append(st.transfer_buffers.pop(tt.transfer_id))
        duration = self.slice_duration_s(slice_spec.ops, dev)
        start = st.timelines.earliest_window([dev], max(placement.start_s, ready, now), duration)
        timing = SliceTiming(slice_spec.slice_id, dev, ready, start, start + duration)
        st.timelines.reserve(dev, start, start + duration, slice_spec.slice_id)
        st.slices[slice_spec.slice_id] = PlacedSlice(slice_spec, timing, allocs)
        st.slice_timings[slice_spec.slice_id] = timing
        self.engine.schedule(SliceFinished(time_s=timing.finish_s, slice_id=slice_spec.slice_id))
        return timing

    def transfer(self, src: str, dst: str, size_bytes: int, *, buffer: bool = True) -> TransferTiming:
        """Send ``size_bytes`` from ``src`` to ``dst`` now (FIFO on the directed link); the
        destination holds a transfer buffer until the consumer frees it (``buffer=False``: the
        bytes land in memory the destination already holds, e.g. copied weights)."""
        link = self.spec.link(src, dst)
        if link is None:
            raise InvalidInputError(f"no link from {src} to {dst}", culprit=f"{src}->{dst}")
        now = self.engine.now_s
        timing = self.state.links.send(link, size_bytes, now)
        tid = timing.transfer_id
        if buffer:
            self.state.transfer_buffers[tid] = self.ledger.overflow(dst, "transfer_buffer", f"transfer/{tid}",
                                                                    size_bytes, at_s=now)
        self.engine.schedule(TransferFinished(time_s=timing.arrival_s, transfer_id=tid))
        return timing

    def transfer_timing(self, transfer_id: int) -> TransferTiming:
        return self.state.links.timing(transfer_id)

    def slice_timing(self, slice_id: str) -> SliceTiming:
        return self.state.slice_timings[slice_id]

    def _on_slice_finished(self, ev: SliceFinished) -> list[Event]:
        st = self.state
        placed = st.slices.pop(ev.slice_id)
        dev = placed.timing.device_id
        for a in placed.allocs:
            st.ledger.free(a)
        st.timelines.release(dev, ev.slice_id)
        for obs in self._observers:
            obs.slice_executed(dev, placed.timing.start_s, placed.timing.finish_s, ev.slice_id)
        return self._wake_idle((dev,), ev.time_s)

    def _on_transfer_finished(self, ev: TransferFinished) -> list[Event]:
        # A transfer alone (not feeding a slice) releases its buffer on arrival.
        buf = self.state.transfer_buffers.pop(ev.transfer_id, None)
        if buf is not None:
            self.ledger.free(buf)
        return []

