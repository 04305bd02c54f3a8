"""Slices cut from the real GMG: the Cypher cut answers exactly as the in-memory one.

Each example traces a random small model (GPT-2 or Llama style, 1-6 layers), imports both its
phases under a fresh tenant (so weights are shared by two phases' operators, as the live service
writes them), cuts every phase at every valid granularity both ways and compares field for
field. The tenant's nodes are deleted afterwards.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.cut import Granularity, cut_graph
from service.domain.error import InvalidInputError, NotFoundError
from service.domain.model_config import ModelConfig, model_config
from service.graph.repository import GraphRepository
from service.models.trace import trace_phase

pytestmark = pytest.mark.neo4j


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    style = draw(st.sampled_from(["gpt2", "llama"]))
    n_heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([4, 8]))
    n_kv_heads = n_heads if style == "gpt2" else draw(st.sampled_from([k for k in (1, 2, 4) if n_heads % k == 0]))
    return dataclasses.replace(
        model_config("tiny" if style == "gpt2" else "tiny-llama"), name=f"rand-{style}",
        n_layers=draw(st.integers(1, 6)), n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=n_heads * head_dim,
        d_ff=draw(st.sampled_from([8, 16, 24])), vocab_size=draw(st.sampled_from([16, 40])), max_seq_len=16)


def granularities(n_layers: int) -> list[Granularity]:
    return [*(Granularity(q) for q in range(1, n_layers + 1) if n_layers % q == 0), Granularity(1, sublayer=True)]


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), batch=st.integers(1, 3), tokens=st.integers(1, 8), context=st.integers(1, 8))
def test_cypher_cuts_like_the_in_memory_cut(repo: GraphRepository, config: ModelConfig, batch: int, tokens: int,
                                            context: int) -> None:
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    graphs = [trace_phase(config, phase, batch=batch, tokens=tokens, context=context) for phase in ("prefill", "decode")]
    try:
        for g in graphs:
            repo.models.import_model(tenant, "m", g)
        for g in graphs:
            for granularity in granularities(config.n_layers):
                got, want = repo.cuts.cut_slices(tenant, "m", g.phase, granularity), cut_graph(g, granularity)
                assert got == want, (g.phase, granularity, first_difference(got, want))
    finally:
        repo.models.delete_tenant(tenant)


def test_a_bad_cut_request_is_refused_before_the_cut_runs(repo: GraphRepository, tenant: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    config = model_config("tiny", n_layers=4)
    repo.models.import_model(tenant, "m", trace_phase(config, "decode", batch=1, context=8))
    ran: list[str] = []
    read = repo._read

    def spy(name: str, **params: Any) -> list[dict[str, Any]]:
        ran.append(name)
        return read(name, **params)

    monkeypatch.setattr(repo, "_read", spy)
    try:
        with pytest.raises(InvalidInputError, match="granularity of 3 layers does not divide tiny's 4 layers"):
            repo.cuts.cut_slices(tenant, "m", "decode", Granularity(3))
        with pytest.raises(InvalidInputError, match="unknown phase 'train'"):
            repo.cuts.cut_slices(tenant, "m", "train", Granularity(2))
        with pytest.raises(NotFoundError, match="no prefill graph"):
            repo.cuts.cut_slices(tenant, "m", "prefill", Granularity(2))
        with pytest.raises(NotFoundError, match="no decode graph"):
            repo.cuts.cut_slices(tenant, "nobody", "decode", Granularity(2))
        assert "cut_slices" not in ran
        cut = repo.cuts.cut_slices(tenant, "m", "decode", Granularity(2))
        assert ran[-2:] == ["model_layers", "cut_slices"]
        assert [(s.first_layer, s.last_layer, s.predecessors) for s in cut] == [(0, 1, ()), (2, 3, (0,))]
    finally:
        repo.models.delete_tenant(tenant)


def test_a_larger_model_cuts_the_same_in_cypher(repo: GraphRepository, tenant: str) -> None:
    """gpt2-small's 12 layers at batch 4 x 64 tokens: every divisor and the attention/MLP cut."""
    g = trace_phase(model_config("gpt2-small"), "prefill", batch=4, tokens=64)
    repo.models.import_model(tenant, "gpt2", g)
    try:
        for granularity in granularities(12):
            got = repo.cuts.cut_slices(tenant, "gpt2", "prefill", granularity)
            want = cut_graph(g, granularity)
            assert got == want, first_difference(got, want)
    finally:
        repo.models.delete_tenant(tenant)


def first_difference(got: list[Any], want: list[Any]) -> Mapping[str, Any]:
    for a, b in zip(got, want, strict=False):
        if a != b:
            return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
                    if getattr(a, f.name) != getattr(b, f.name)}
    return {"lengths": (len(got), len(want))}
