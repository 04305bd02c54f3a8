"""The staged runner: splitting a model over stages never changes what it generates."""

from __future__ import annotations

import pytest
import torch

from executor.batcher import ContinuousBatcher, GenerationRequest, generate_alone
from executor.device import torch_device
from executor.runner import Stage, StagedModel, activation_bytes, check_stages, load_staged
from service.domain.model_config import model_config
from service.models.family import build_model

SPLITS = {
    "one-stage": [Stage("cpu:0", 0, 2)],
    "two-stage": [Stage("cpu:0", 0, 1), Stage("cpu:1", 1, 2)],
}


def _prompts(seed: int) -> list[tuple[list[int], int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (n,), generator=gen).tolist(), m) for n, m in ((5, 7), (17, 3), (1, 9), (12, 6))]


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("family", ["tiny", "tiny-llama"])
def test_staged_batch_generates_what_the_whole_model_generates_alone(family: str, split: str) -> None:
    torch.set_num_threads(1)
    staged = load_staged(family, 7, SPLITS[split])
    reference = build_model(model_config(family), seed=7)
    specs = _prompts(3)
    batcher = ContinuousBatcher(staged, max_batch=4, max_context=64)
    for i, (prompt, m) in enumerate(specs):
        batcher.submit(GenerationRequest(f"r{i}", prompt, m))
    while not batcher.idle:
        batcher.step()
    done = {r.request_id: r for r in batcher.take_finished()}
    assert len(done) == len(specs)
    for i, (prompt, m) in enumerate(specs):
        assert done[f"r{i}"].tokens == generate_alone(reference, prompt, m), f"r{i}"
    assert max(len(it.decode_contexts) for it in batcher.iterations) == len(specs)  # decoded together
    assert len(batcher.pool) == len(SPLITS[split])


def test_stage_weights_are_those_of_their_layers() -> None:
    staged = load_staged("tiny-llama", 1, SPLITS["two-stage"])
    whole = build_model(model_config("tiny-llama"), seed=1)
    assert [len(b) for b in staged.stage_blocks] == [1, 1]
    assert torch.equal(staged.stage_blocks[1][0].mlp.up_proj.weight, whole.blocks[1].mlp.up_proj.weight)
    assert staged.param_bytes() == model_config("tiny-llama").num_params() * 4


def test_gpt2_head_stays_tied_to_the_embedding_on_one_device() -> None:
    staged = load_staged("tiny", 1, SPLITS["two-stage"])
    assert staged.lm_head.weight is staged.embed.weight
    assert staged.param_bytes() == model_config("tiny").num_params() * 4


def test_stages_must_cover_the_layers_in_order() -> None:
    check_stages([Stage("cpu:0", 0, 1), Stage("cpu:0", 1, 2)], 2)
    for bad in ([], [Stage("cpu:0", 0, 1)], [Stage("cpu:0", 1, 2)], [Stage("cpu:0", 0, 1), Stage("cpu:1", 2, 2)],
                [Stage("cpu:0", 0, 2), Stage("cpu:1", 2, 2)]):
        with pytest.raises(ValueError):
            check_stages(bad, 2)


def test_device_ids_map_to_torch_devices() -> None:
    assert torch_device("cpu:3") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device"):
        torch_device("tpu:0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            torch_device("cuda:0")


def test_iterations_and_requests_carry_their_measurements() -> None:
    model = StagedModel(build_model(model_config("tiny"), seed=0), SPLITS["two-stage"])
    batcher = ContinuousBatcher(model, max_batch=2, max_context=32)
    batcher.submit(GenerationRequest("a", [1, 2, 3], 4))
    batcher.submit(GenerationRequest("b", [4, 5], 2))
    while not batcher.idle:
        batcher.step()
    a, b = sorted(batcher.take_finished(), key=lambda r: r.request_id)
    assert batcher.take_finished() == []
    assert (a.iterations, b.iterations) == (4, 2)  # a prefill plus one decode step per further token
    assert b.busy_s == pytest.approx(sum(it.duration_s for it in list(batcher.iterations)[:2]))
    resident = model.param_bytes() + sum(t.numel() * t.element_size() for t in batcher.pool)
    first = activation_bytes(model.config, batch=1, tokens=3, context=0)
    assert batcher.iterations[0].peak_bytes == resident + first
    assert a.peak_bytes == max(it.peak_bytes for it in batcher.iterations) > resident


def test_removed_requests_free_their_slot_and_leave_the_others_intact() -> None:
    model = build_model(model_config("tiny-llama"), seed=2)
    batcher = ContinuousBatcher(model, max_batch=2, max_context=32)
    specs = {"a": ([1, 2, 3], 6), "b": ([9, 8], 5), "c": ([7], 4)}
    for rid, (prompt, m) in specs.items():
        batcher.submit(GenerationRequest(rid, prompt, m))
    batcher.step()
    batcher.step()
    removed = batcher.remove("a")  # running in slot 0: slot 1 ("b") moves into it
    assert removed is not None and removed.request_id == "a"
    assert batcher.remove("a") is None
    while not batcher.idle:
        batcher.step()
    done = {r.request_id: r.tokens for r in batcher.take_finished()}
    assert set(done) == {"b", "c"}
    for rid in done:
        assert done[rid] == generate_alone(model, *specs[rid])
    batcher.submit(GenerationRequest("d", [5], 3))
    assert batcher.remove("d") is not None and batcher.idle


def test_prompt_tokens_outside_the_vocabulary_are_refused() -> None:
    batcher = ContinuousBatcher(build_model(model_config("tiny"), seed=0), max_batch=1, max_context=16)
    with pytest.raises(ValueError, match=r"must lie in \[0, 256\)"):
        batcher.submit(GenerationRequest("x", [1, 256], 2))


@pytest.mark.slow
def test_a_fresh_process_builds_its_first_model_without_torchs_python_references() -> None:
    """Building on meta and filling the weights must not run ops that lack a native meta kernel:
    their Python references import sympy and torch._dynamo on first use, seconds of every fresh
    executor's first build (where bytecode is not cached, e.g. PYTHONDONTWRITEBYTECODE)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from executor.runner import Stage, load_staged\n"
            "from service.models.family import model_config\n"
            "for family in ('tiny', 'small-llama'):\n"
            "    load_staged(family, 0, [Stage('cpu:0', 0, model_config(family).n_layers)])\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False"], out.stdout + out.stderr


def test_a_prefill_is_timed_per_stage_and_its_completion_carries_the_times() -> None:
    """Each stage of a prefill gets its own positive time (what the GMG keeps as slice
    observations); timing changes nothing computed; a remote stage's time is not its own."""
    import math

    from executor.runner import _StageTimer
    from executor.worker import Lease, completion_of

    torch.set_num_threads(1)
    staged = load_staged("tiny", 7, SPLITS["two-stage"])
    ids, pos = torch.tensor([[5, 6, 7, 8]]), torch.arange(4)[None]
    times: list[float] = []
    with torch.inference_mode():
        timed, _ = staged(ids, pos, last_logits_only=True, stage_times=times)
        plain, _ = staged(ids, pos, last_logits_only=True)
    assert torch.equal(timed, plain)
    assert len(times) == 2 and all(t > 0 for t in times)

    batcher = ContinuousBatcher(staged, max_batch=2, max_context=32)
    batcher.submit(GenerationRequest("r", [1, 2, 3], 3))
    batcher.submit(GenerationRequest("s", [1, 2, 3, 4, 5, 6], 3))
    while not batcher.idle:
        batcher.step()
    req, other = sorted(batcher.take_finished(), key=lambda r: r.request_id)
    assert len(req.prefill_stage_s) == 2 and all(t > 0 for t in req.prefill_stage_s)
    # each request's first decode iteration, timed per stage: both in one batch of 2, padded to
    # the longer cached context (the 6 prompt tokens; the new token's KV is written by this step)
    for r in (req, other):
        assert len(r.decode_stage_s) == 2 and all(t > 0 for t in r.decode_stage_s)
        assert (r.decode_batch, r.decode_context) == (2, 6)
    lease = Lease("l1", "r", "a/m@x", "tiny", 7, tuple(SPLITS["two-stage"]), (1, 2, 3), 3, received_s=req.arrival_s)
    req.prefill_stage_s = (req.prefill_stage_s[0], math.nan)  # as a remote stage leaves it
    c = completion_of(lease, req)
    assert c.prefill_stage_s == (req.prefill_stage_s[0], None)
    assert c.to_json()["prefill_stage_s"] == [req.prefill_stage_s[0], None]  # JSON: no NaN on the wire

    timer = _StageTimer([], [torch.device("cpu")] * 4)
    timer.lap(0)
    timer.remote(1, None)
    timer.lap(1)  # a remote stage whose server reported nothing keeps nan
    timer.remote(2, 0.25)  # one that reported its layers' time has it
    timer.lap(2)
    timer.lap(3)
    assert timer.out is not None and timer.out[0] >= 0 and math.isnan(timer.out[1]) and timer.out[2] == 0.25
    assert timer.out[3] >= 0
