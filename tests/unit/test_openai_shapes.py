"""The OpenAI-compatible API's pure parts: text from tokens as they come, the token buffers of
streams, the per-request SLO and priority headers, and the fields the service refuses."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from service.api.intake import request_hints
from service.api.openai import (
    ChatCompletionIn,
    CompletionIn,
    IncrementalDecoder,
    StopMatcher,
    cut_at_stop,
    finish_reason,
)
from service.domain.error import InvalidInputError
from service.domain.request import RequestStatus
from service.domain.tokenizer import BYTES
from service.live.metrics import sla_met
from service.live.records import LiveRequest
from service.live.streams import StreamBook
from service.sim.sla import SLA_CLASSES


@given(st.text(max_size=40), st.lists(st.integers(0, 255), max_size=30), st.lists(st.integers(1, 5), min_size=1))
def test_streamed_text_concatenates_to_the_whole_text(text: str, noise: list[int], sizes: list[int]) -> None:
    tokens = BYTES.encode(text) + noise  # valid UTF-8, then arbitrary bytes
    decoder = IncrementalDecoder(BYTES)
    pieces, i, k = [], 0, 0
    while i < len(tokens):
        n = sizes[k % len(sizes)]
        pieces.append(decoder.push(tokens[i:i + n]))
        i, k = i + n, k + 1
    pieces.append(decoder.flush())
    assert "".join(pieces) == BYTES.decode(tokens)


def test_a_multibyte_character_waits_for_its_last_byte() -> None:
    decoder = IncrementalDecoder(BYTES)
    check = BYTES.encode("✓")
    assert decoder.push(check[:2]) == "" and decoder.push([*check[2:], 33]) == "✓!"


def request(rid: str = "r1", output: list[int] | None = None, status: RequestStatus = RequestStatus.DONE) -> LiveRequest:
    return LiveRequest(rid, "t", "m", [1], 8, "standard", 8, 0.0, status=status, output_tokens=output or [])


def test_a_stream_buffers_tokens_by_position_and_is_completed_by_the_result() -> None:
    book = StreamBook()
    stream = book.open("r1", progress=True)
    assert book.wants_progress("r1") and not book.wants_progress("r2")
    book.offer("r1", 0, [5, 6])
    book.offer("r1", 1, [6, 7])  # a repeat of position 1, then a new token
    book.offer("r1", 5, [9])  # a gap: refused (the result fills it)
    assert stream.tokens == [5, 6, 7] and not stream.ended
    book.end(request(output=[5, 6, 7, 8, 9]))
    assert stream.tokens == [5, 6, 7, 8, 9] and stream.status == RequestStatus.DONE and not stream.diverged
    book.close("r1")
    assert len(book) == 0


def test_a_rerun_that_differs_from_what_was_streamed_is_marked() -> None:
    stream = StreamBook().open("r1", progress=True)
    stream.offer(0, [5, 6])
    stream.end(request(output=[5, 4, 3]))
    assert stream.diverged


def test_a_reader_wakes_on_new_tokens_and_on_the_end() -> None:
    async def scenario() -> list[int]:
        stream = StreamBook().open("r1", progress=True)
        seen: list[int] = []

        async def reader() -> None:
            while not stream.ended:
                await stream.wait(len(seen))
                seen.extend(stream.tokens[len(seen):])

        task = asyncio.ensure_future(reader())
        await asyncio.sleep(0)
        stream.offer(0, [1])
        await asyncio.sleep(0)
        stream.end(request(output=[1, 2], status=RequestStatus.DONE))
        await asyncio.wait_for(task, 1.0)
        return seen

    assert asyncio.run(scenario()) == [1, 2]


def test_slo_headers_override_the_class_and_bad_ones_are_refused() -> None:
    hints = request_hints("250", "20.5", "-7")
    assert (hints.slo_ttft_s, hints.slo_tpot_s, hints.priority) == (0.25, 0.0205, -7)
    sla = SLA_CLASSES["standard"].with_targets(hints.slo_ttft_s, None)
    assert (sla.ttft_s, sla.tbt_s, sla.e2e_s) == (0.25, SLA_CLASSES["standard"].tbt_s, SLA_CLASSES["standard"].e2e_s)
    assert sla.name == "standard+ttft=250ms" and SLA_CLASSES["batch"].with_targets() is SLA_CLASSES["batch"]
    req = request(output=[1, 2, 3])
    req.ttft_s, req.e2e_s = 0.5, 0.8  # 0.15 s per output token after the first
    assert sla_met(req)  # the standard class's targets
    req.slo_tpot_s = 0.1
    assert req.sla.tbt_s == 0.1 and req.sla.ttft_s == SLA_CLASSES["standard"].ttft_s and not sla_met(req)
    for ttft, tpot, priority in (("abc", None, None), ("0", None, None), ("inf", None, None), (None, "-1", None),
                                 (None, None, "1.5"), (None, None, "101")):
        with pytest.raises(InvalidInputError, match="header"):
            request_hints(ttft, tpot, priority)
    assert math.isclose(request_hints(None, "1e3", None).slo_tpot_s or 0.0, 1.0)


def test_fields_the_service_cannot_honour_are_refused_by_name() -> None:
    with pytest.raises(ValidationError):
        CompletionIn.model_validate({"model": "m", "prompt": "x", "n": 2})
    with pytest.raises(ValidationError):
        ChatCompletionIn.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": []})
    CompletionIn.model_validate({"model": "m", "prompt": "x", "n": 1, "frequency_penalty": 0, "logit_bias": {},
                                 "best_of": 1, "echo": False, "stop": None}).check_supported()
    for field, value in (("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]), ("presence_penalty", 0.5),
                         ("logprobs", 2), ("echo", True)):
        body = CompletionIn.model_validate({"model": "m", "prompt": "x", field: value})
        with pytest.raises(InvalidInputError) as caught:
            body.check_supported()
        assert caught.value.culprit == field
    with pytest.raises(InvalidInputError, match="stream_options"):
        CompletionIn.model_validate({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}
                                    ).check_supported()


def test_the_finish_reason_is_stop_only_at_a_stop_id() -> None:
    assert finish_reason([3, 4], (4,)) == "stop"
    assert finish_reason([3, 4], ()) == "length"
    assert finish_reason([], (4,)) == "length"


def test_stop_sequences_are_taken_as_a_string_or_a_list() -> None:
    assert CompletionIn.model_validate({"model": "m", "prompt": "x", "stop": "\n"}).stop_sequences() == ("\n",)
    body = CompletionIn.model_validate({"model": "m", "prompt": "x", "stop": ["END", "\n\n"]})
    body.check_supported()
    assert body.stop_sequences() == ("END", "\n\n")
    assert cut_at_stop("one\n\ntwo END", body.stop_sequences()) == ("one", True)
    assert cut_at_stop("no stop here", body.stop_sequences()) == ("no stop here", False)


@given(st.text(alphabet="abc\n", max_size=40), st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4),
                                                        max_size=4),
       st.lists(st.integers(min_value=0, max_value=40), max_size=8))
def test_a_stream_through_the_stop_matcher_sends_what_the_whole_answer_would(text: str, stops: list[str],
                                                                             splits: list[int]) -> None:
    """Pushed in any pieces, the text sent is the whole text cut at its first stop sequence,
    and the stream stops exactly when the whole answer has one."""
    cuts = sorted({min(s, len(text)) for s in splits})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    matcher, sent, stopped = StopMatcher(stops), "", False
    for piece in pieces:
        out, stopped = matcher.push(piece)
        sent += out
        if stopped:
            break
    if not stopped:
        sent += matcher.flush()
    assert (sent, stopped) == cut_at_stop(text, stops)
