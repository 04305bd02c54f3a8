"""Bad operator graphs are refused with an error that names the culprit."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.domain.error import InvalidGraphError
from service.domain.opgraph import OperatorGraph


def doc() -> dict[str, Any]:
    return {
        "model_name": "toy", "phase": "prefill", "shape": {"batch": 1, "tokens": 4},
        "tensors": [
            {"tensor_id": "x", "kind": "input", "shape": [1, 4, 8], "dtype": "float32"},
            {"tensor_id": "w", "kind": "weight", "shape": [8, 8], "dtype": "float32"},
            {"tensor_id": "h", "kind": "activation", "shape": [1, 4, 8], "dtype": "float32"},
            {"tensor_id": "y", "kind": "activation", "shape": [1, 4, 8], "dtype": "float32"},
        ],
        "operators": [
            {"op_id": "mm", "kind": "linear", "flops": 512, "inputs": ["x", "w"], "outputs": ["h"]},
            {"op_id": "act", "kind": "activation", "flops": 32, "inputs": ["h"], "outputs": ["y"]},
        ],
    }


def test_a_good_document_is_accepted() -> None:
    g = OperatorGraph.from_dict(doc())
    assert g.edges() == [("mm", "act")]
    assert g.tensors["w"].size_bytes == 256


def mutate(fn: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc())
    fn(d)
    return d


@pytest.mark.parametrize(("broken", "culprit", "message"), [
    # a cycle: mm reads y, which act writes from h, which mm writes
    (mutate(lambda d: d["operators"][0]["inputs"].append("y")), "act", "cycle"),
    (mutate(lambda d: d["operators"][1]["inputs"].append("ghost")), "ghost", "dangling"),
    (mutate(lambda d: d["tensors"][1].update(shape=[8, 0])), "w", "positive"),
    (mutate(lambda d: d["tensors"][1].update(shape=[8, -2])), "w", "positive"),
    (mutate(lambda d: d["operators"][0].update(flops=-1)), "mm", "negative flops"),
    (mutate(lambda d: d["operators"].append(dict(d["operators"][1], outputs=["z"]))), "act", "duplicate operator"),
    (mutate(lambda d: d["tensors"].append(dict(d["tensors"][0]))), "x", "duplicate tensor"),
    (mutate(lambda d: d["tensors"].append({"tensor_id": "orphan", "kind": "activation", "shape": [1],
                                           "dtype": "float32"})), "orphan", "no producer"),
    (mutate(lambda d: d["operators"][1].update(outputs=["h"])), "h", "written by both"),
    (mutate(lambda d: d["tensors"][0].update(kind="gradient")), "x", "unknown kind"),
    (mutate(lambda d: d["tensors"][0].update(dtype="float7")), "x", "unknown dtype"),
])
def test_bad_graphs_name_their_culprit(broken: dict[str, Any], culprit: str, message: str) -> None:
    with pytest.raises(InvalidGraphError, match=message) as err:
        OperatorGraph.from_dict(broken)
    assert err.value.culprit == culprit
    assert culprit in str(err.value)


@pytest.mark.parametrize("broken", [[], {"tensors": "no"}, {"tensors": [], "operators": [{"op_id": "a"}]}])
def test_malformed_documents_get_a_message(broken: Any) -> None:
    with pytest.raises(InvalidGraphError):
        OperatorGraph.from_dict(broken)
