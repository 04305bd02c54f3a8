"""Workflow generators: three agentic shapes, seeded and deterministic.

The generators are pure: every draw comes from the injected ``numpy.random.Generator`` in a
fixed order, so the same seed and arguments give identical workflows. Lengths come from real
traces, handed in as :class:`TraceLengths` (:func:`trace_lengths` reads them, in place, through
the data locator: the Azure LLM 2023 traces and the ServeGen multimodal clients).

Shapes (each workflow carries its true output lengths and tool durations, as a replay trace):

``code-generation``
    a planner (prompt: the task, an Azure *code* prompt; output: an Azure *conv* output) fans
    out to N coders (N from the task's length, 2..5), each coder's output runs through a test
    tool (code execution), a reviewer (output: an Azure *code* output, a short verdict) joins
    them; with probability ``retry_p`` the review fails and the failed coders run again after
    it (new tests, a new review), at most ``max_retries`` rounds.
``deep-research``
    a question (an Azure *conv* prompt) starts a chain of rounds ``search -> read -> summarise``;
    the number of rounds grows with the question's length (log2 of tokens / 250, plus noise,
    1..6); a final answer uses every summary.
``multimodal``
    an image preprocessing tool (duration linear in image tokens) then a vision-language model
    call on text plus image tokens; sizes from one ServeGen ``mm-image`` client's PMFs.

Tool durations are lognormal (no public trace of them exists; the medians are stated in
:data:`TOOL_MEDIANS_S`). Models stand in by size (the family has no VLM: the ``vlm`` role runs a
Llama of the given name on text plus image tokens, which is what its prefill costs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.domain.error import InvalidInputError
from service.domain.workflow import ModelCall, Step, ToolCall, Workflow
from service.workload.client import Pmf

__all__ = ["SHAPES", "TOOL_MEDIANS_S", "ShapeConfig", "TraceLengths", "code_generation", "deep_research",
           "generate", "multimodal", "trace_lengths"]

#: Median seconds of each tool (lognormal, sigma :data:`TOOL_SIGMA`); ``preprocess`` adds
#: ``PREPROCESS_S_PER_IMAGE_TOKEN`` per image token.
TOOL_MEDIANS_S: dict[str, float] = {"python": 1.5, "search": 0.6, "fetch": 1.2, "preprocess": 0.08}
TOOL_SIGMA = 0.6
PREPROCESS_S_PER_IMAGE_TOKEN = 4e-4
_CONTEXT_CAP = 3500  # prompt tokens a step is clamped to (the family's 4,096-token context)


@dataclass(frozen=True, slots=True)
class TraceLengths:
    """Length pools from real traces: (prompt, output) pairs and multimodal PMFs."""

    code: np.ndarray  # shape (n, 2): Azure code prompt, output tokens
    conv: np.ndarray  # shape (n, 2): Azure conv prompt, output tokens
    images: tuple[tuple[Pmf, Pmf, Pmf, Pmf], ...]  # per ServeGen (client, window): text, image, count, output

    def pair(self, rng: np.random.Generator, which: str) -> tuple[int, int]:
        pool = self.code if which == "code" else self.conv
        p, o = pool[int(rng.integers(len(pool)))]
        return int(p), int(o)


@dataclass(frozen=True, slots=True)
class ShapeConfig:
    """One shape's tenant, model and SLO, and its knobs."""

    tenant_id: str
    model: str
    slo_s: float
    retry_p: float = 0.3  # code-generation: a review fails
    max_retries: int = 2

    def __post_init__(self) -> None:
        if not (self.slo_s > 0) or not (0.0 <= self.retry_p <= 1.0) or self.max_retries < 0:
            raise InvalidInputError(f"shape {self.tenant_id}: slo_s > 0, retry_p in [0, 1], max_retries >= 0")


def _tool_s(rng: np.random.Generator, tool: str, extra_s: float = 0.0) -> float:
    return round(TOOL_MEDIANS_S[tool] * math.exp(TOOL_SIGMA * float(rng.standard_normal())) + extra_s, 6)


def _clamp(tokens: int, cap: int = _CONTEXT_CAP) -> int:
    return max(1, min(int(tokens), cap))


def code_generation(rng: np.random.Generator, wid: str, arrival_s: float, lengths: TraceLengths,
                    cfg: ShapeConfig) -> Workflow:
    task, _ = lengths.pair(rng, "code")
    task = _clamp(task, 2500)
    _, plan_out = lengths.pair(rng, "conv")
    n = int(np.clip(2 + task // 1200 + rng.integers(0, 2), 2, 5))
    steps: list[Step] = [ModelCall("plan", "planner", cfg.model, 150, inputs=("task",), output_tokens=_clamp(plan_out, 800))]
    coders = [f"code{i}" for i in range(n)]
    for c in coders:
        _, out = lengths.pair(rng, "conv")
        steps.append(ModelCall(c, "coder", cfg.model, 100, uses=("plan",), output_tokens=_clamp(out, 700)))
        steps.append(ToolCall(f"test-{c}", "code-exec", "python", uses=(c,), output_tokens=40,
                              duration_s=_tool_s(rng, "python")))
    _, verdict = lengths.pair(rng, "code")
    review = "review"
    steps.append(ModelCall(review, "reviewer", cfg.model, 120, uses=tuple(f"test-{c}" for c in coders),
                           output_tokens=_clamp(verdict, 300)))
    for k in range(1, cfg.max_retries + 1):
        if rng.random() >= cfg.retry_p:
            break
        failed = [c for c in coders if rng.random() < 0.5] or [coders[int(rng.integers(n))]]
        redo = []
        for c in failed:
            _, out = lengths.pair(rng, "conv")
            sid = f"{c}-r{k}"
            steps.append(ModelCall(sid, "coder-retry", cfg.model, 120, uses=(review,), output_tokens=_clamp(out, 700)))
            steps.append(ToolCall(f"test-{sid}", "code-exec", "python", uses=(sid,), output_tokens=40,
                                  duration_s=_tool_s(rng, "python")))
            redo.append(f"test-{sid}")
        _, verdict = lengths.pair(rng, "code")
        nxt = f"review-r{k}"
        steps.append(ModelCall(nxt, "reviewer", cfg.model, 120, uses=tuple(redo), output_tokens=_clamp(verdict, 300)))
        review = nxt
    return Workflow(wid, cfg.tenant_id, cfg.slo_s, tuple(steps), arrival_s=arrival_s, inputs={"task": task},
                    shape="code-generation")


def deep_research(rng: np.random.Generator, wid: str, arrival_s: float, lengths: TraceLengths,
                  cfg: ShapeConfig) -> Workflow:
    question, _ = lengths.pair(rng, "conv")
    question = _clamp(question, 1500)
    depth = int(np.clip(round(math.log2(1 + question / 250) + 0.7 * float(rng.standard_normal())), 1, 6))
    steps: list[Step] = []
    prev: tuple[str, ...] = ()
    summaries = []
    for k in range(depth):
        found = int(rng.integers(150, 400))
        steps.append(ToolCall(f"search{k}", "search", "search", uses=prev, inputs=("question",), output_tokens=found,
                              duration_s=_tool_s(rng, "search")))
        page = int(np.clip(rng.lognormal(math.log(900), 0.5), 200, 2000))
        steps.append(ToolCall(f"read{k}", "read", "fetch", uses=(f"search{k}",), output_tokens=page,
                              duration_s=_tool_s(rng, "fetch")))
        _, out = lengths.pair(rng, "conv")
        steps.append(ModelCall(f"summarise{k}", "summarise", cfg.model, 80, uses=(f"read{k}", *prev),
                               inputs=("question",), output_tokens=_clamp(out // 2, 400)))
        prev = (f"summarise{k}",)
        summaries.append(f"summarise{k}")
    _, out = lengths.pair(rng, "conv")
    steps.append(ModelCall("answer", "answer", cfg.model, 60, uses=tuple(summaries), inputs=("question",),
                           output_tokens=_clamp(out, 800)))
    return Workflow(wid, cfg.tenant_id, cfg.slo_s, tuple(steps), arrival_s=arrival_s, inputs={"question": question},
                    shape="deep-research")


def _draw(rng: np.random.Generator, pmf: Pmf) -> float:
    return float(pmf.values[int(rng.choice(len(pmf.values), p=np.asarray(pmf.probs) / sum(pmf.probs)))])


def multimodal(rng: np.random.Generator, wid: str, arrival_s: float, lengths: TraceLengths,
               cfg: ShapeConfig) -> Workflow:
    if not lengths.images:
        raise InvalidInputError("multimodal: no ServeGen mm-image PMFs in the trace lengths")
    text_pmf, image_pmf, count_pmf, out_pmf = lengths.images[int(rng.integers(len(lengths.images)))]
    text = int(_draw(rng, text_pmf))
    count = max(1, int(_draw(rng, count_pmf)))
    image = _clamp(int(_draw(rng, image_pmf)) or 256 * count, 3000)
    out = _clamp(int(_draw(rng, out_pmf)), 400)
    steps: tuple[Step, ...] = (
        ToolCall("preprocess", "preprocess", "preprocess", inputs=("image",), output_tokens=image,
                 duration_s=_tool_s(rng, "preprocess", PREPROCESS_S_PER_IMAGE_TOKEN * image)),
        ModelCall("vlm", "vlm", cfg.model, 20, uses=("preprocess",), inputs=("text",), output_tokens=out),
    )
    return Workflow(wid, cfg.tenant_id, cfg.slo_s, steps, arrival_s=arrival_s, inputs={"text": text, "image": 0},
                    shape="multimodal")


Generator = Callable[[np.random.Generator, str, float, TraceLengths, ShapeConfig], Workflow]
SHAPES: dict[str, Generator] = {"code-generation": code_generation, "deep-research": deep_research,
                                "multimodal": multimodal}


def generate(rng: np.random.Generator, lengths: TraceLengths, rates_per_s: Mapping[str, float],
             configs: Mapping[str, ShapeConfig], *, duration_s: float) -> list[Workflow]:
    """Poisson arrivals of each shape at its rate over ``[0, duration_s)``, merged by arrival
    (ties: shape order of ``rates_per_s``). Ids are ``<shape>-<n>``."""
    out: list[Workflow] = []
    for shape, rate in rates_per_s.items():
        if shape not in SHAPES:
            raise InvalidInputError(f"unknown workflow shape {shape!r}; known: {', '.join(SHAPES)}", culprit=shape)
        if not (rate >= 0.0) or math.isinf(rate):
            raise InvalidInputError(f"shape {shape}: rate must be finite and >= 0, got {rate}", culprit=shape)
        t = 0.0
        n = 0
        while rate > 0:
            t += float(rng.exponential(1.0 / rate))
            if t >= duration_s:
                break
            out.append(SHAPES[shape](rng, f"{shape}-{n}", round(t, 6), lengths, configs[shape]))
            n += 1
    order = {s: i for i, s in enumerate(rates_per_s)}
    out.sort(key=lambda w: (w.arrival_s, order[w.shape]))
    return out


# ---- the real traces (reads files: not part of the pure generators) -------------------------
@lru_cache(maxsize=2)
def trace_lengths(image_clients: Sequence[str] | None = None) -> TraceLengths:
    """The Azure LLM 2023 code and conv (prompt, output) pairs and the ServeGen ``mm-image``
    clients' PMFs (all clients, or those named ``chunk-N``), read in place from the data
    folders (``DataMissingError`` naming ``slicesched data fetch`` when absent)."""
    from service.data import resolve
    from service.workload.readers import read_azure, read_servegen_clients

    pools = []
    for name in ("code", "conv"):
        reqs = read_azure(resolve(f"azure-llm-2023/AzureLLMInferenceTrace_{name}.csv"), tenant_id=name,
                          model="m").requests
        pools.append(np.array([(r.prompt_tokens, r.output_tokens) for r in reqs], dtype=np.int64))
    images = []
    for client in read_servegen_clients(resolve("servegen/multimodal/mm-image")):
        if image_clients is not None and client.client_id not in image_clients:
            continue
        for w in client.length_windows:
            if not w.is_empty and w.pmfs["image_tokens"].mean > 0:
                images.append((w.pmfs["text_tokens"], w.pmfs["image_tokens"], w.pmfs["image_count"],
                               w.pmfs["output_tokens"]))
    return TraceLengths(pools[0], pools[1], tuple(images))
