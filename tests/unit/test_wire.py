"""The executor protocol's shapes: what one side writes the other reads back, and the service's
HTTP bodies validate the same fields."""

from __future__ import annotations

from dataclasses import fields

import pytest

from service.api.schemas import CompletionIn, FailIn, HeartbeatIn, PollIn, ProgressUpdateIn
from service.domain.error import InvalidInputError
from service.domain.sampling import Sampling
from service.domain.wire import Completion, Failure, Heartbeat, LeaseGrant, Poll, ProgressUpdate, WireStage


def test_a_lease_grant_reads_back_as_written() -> None:
    grant = LeaseGrant("L1", "r1", "acme/chat@e/cpu:0", "tiny", 3,
                       (WireStage("cpu:0", 0, 1, global_device_id="e/cpu:0"),
                        WireStage("cpu:0", 1, 2, "http://10.0.0.2:9000", "f/cpu:0")),
                       (1, 2, 3), 4, tenant_id="acme", model_id="chat", expires_in_s=10.0)
    raw = grant.to_json()
    assert raw["stages"][0] == {"device_id": "cpu:0", "global_device_id": "e/cpu:0", "layers": [0, 1]}
    assert raw["stages"][1]["url"] == "http://10.0.0.2:9000"
    assert LeaseGrant.from_json(raw) == grant


def test_a_lease_grant_carries_sampling_stop_ids_streaming_and_guest() -> None:
    grant = LeaseGrant("L1", "r1", "x", "tiny", 3, (WireStage("cpu:0", 0, 2),), (1,), 4,
                       sampling=Sampling(0.7, 0.9, 2**40), stop_ids=(0, 2), stream=True, guest=True,
                       tpot_s=0.1)
    raw = grant.to_json()
    assert (raw["temperature"], raw["top_p"], raw["sampling_seed"], raw["stop_ids"], raw["stream"], raw["guest"]) == \
        (0.7, 0.9, 2**40, [0, 2], True, True)
    assert raw["tpot_s"] == 0.1
    assert LeaseGrant.from_json(raw) == grant
    assert "guest" not in LeaseGrant("L2", "r1", "x", "tiny", 3, (WireStage("cpu:0", 0, 2),), (1,), 4).to_json()
    with pytest.raises(InvalidInputError, match="top_p"):
        LeaseGrant.from_json({**raw, "top_p": 2.0})


def test_a_lease_grant_needs_only_what_an_executor_runs() -> None:
    grant = LeaseGrant.from_json({"lease_id": "L1", "request_id": "r1", "replica_id": "x", "family": "tiny",
                                  "seed": None, "stages": [{"device_id": "cpu:1", "layers": [1, 2]}],
                                  "prompt_tokens": [5], "max_tokens": 2})
    assert grant.seed == 0 and grant.stages == (WireStage("cpu:1", 1, 2),)
    assert grant.sampling.greedy and grant.stop_ids == () and not grant.stream
    with pytest.raises(KeyError):
        LeaseGrant.from_json({"lease_id": "L1"})


def test_the_http_bodies_validate_the_wire_fields() -> None:
    assert set(CompletionIn.model_fields) == {f.name for f in fields(Completion)}
    assert set(PollIn.model_fields) == {f.name for f in fields(Poll)}
    assert set(HeartbeatIn.model_fields) == {f.name for f in fields(Heartbeat)}
    assert set(ProgressUpdateIn.model_fields) == {f.name for f in fields(ProgressUpdate)}
    v = ProgressUpdateIn.model_validate(ProgressUpdate("L1", 3, (7, 8)).to_json())
    assert (v.lease_id, v.offset, v.tokens) == ("L1", 3, [7, 8])
    assert set(Failure(lease_id="L1", reason="oom").to_json()) <= set(FailIn.model_fields)
    c = Completion("L1", [1, 2], 0.0, 0.1, 0.2, 2, 0.05, 1024)
    assert Completion(**CompletionIn.model_validate(c.to_json()).model_dump()) == c
    assert PollIn.model_validate(Poll("e1", 2, 1.5).to_json()).max_leases == 2
    assert PollIn.model_validate(Poll("e1", 2, 1.5).to_json()).ready is None  # says nothing: no limit
    assert PollIn.model_validate(Poll("e1", 2, 1.5, ("a/m@cpu:0",)).to_json()).ready == ["a/m@cpu:0"]
    assert HeartbeatIn.model_validate(Heartbeat(("L1",), 3.0).to_json()).running == ["L1"]
