"""The OpenAI-compatible API's shapes and conversions: request bodies, answers, stream chunks,
errors, and text from tokens as they come. The routes are :mod:`service.api.routers.openai`.

Bodies follow OpenAI's Completions and Chat Completions; a field this service cannot honour is a
400 naming it (``n`` > 1, penalties, ``logit_bias``, ``logprobs``, ``echo``, ``best_of`` > 1,
``suffix``, tools: any unknown field), its default value is accepted. ``stop`` sequences cut the
text where the first one begins (finish reason ``stop``): a stream ends there and its request is
cancelled; an answer waited for whole is cut when the request ends (the executor stops at the
model's stop ids and ``max_tokens`` only, so usage counts the tokens it produced).
``return_token_ids: true`` (an extension, as vLLM's) adds the output token ids to each choice and
chunk. Errors on these routes are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from service.domain.error import InvalidInputError
from service.domain.sampling import MAX_SEED, MAX_TEMPERATURE
from service.domain.tokenizer import Tokenizer
from service.live.records import LiveRequest

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions; chat's default is the rest of the context
MAX_STOPS = 4  # as OpenAI allows
MAX_STOP_CHARS = 256

#: OpenAI's error ``type`` per status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
               429: "rate_limit_error", 503: "service_unavailable_error"}


# ---- bodies ----------------------------------------------------------------------------------------
class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(OpenAIBody):
    include_usage: bool | None = Field(None, description="a last chunk with the usage (and no choices)")


class SamplingBody(OpenAIBody):
    """What both endpoints take."""

    model: str = Field(min_length=1, max_length=200, description="one of your models (GET /v1/models)")
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description="0 (default): greedy")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus mass (default 1)")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="the same seed gives the same tokens")
    n: int | None = Field(None, ge=1, le=1, description="only 1")
    stream: bool | None = Field(False, description="answer server-sent events, token by token")
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOPS} strings: the text ends before the "
                                                           "first one produced (not included), finish_reason "
                                                           "'stop'; a stream ends there")
    frequency_penalty: float | None = Field(None, description="only 0")
    presence_penalty: float | None = Field(None, description="only 0")
    logit_bias: dict[str, float] | None = Field(None, description="only empty")
    user: str | None = Field(None, max_length=256, description="accepted, unused")
    return_token_ids: bool | None = Field(None, description="extension: the output token ids in each choice/chunk")

    def check_supported(self) -> None:
        """A 400 naming the first field set to something this service cannot do."""
        self.stop_sequences()
        for name, value, default in (("frequency_penalty", self.frequency_penalty or 0, 0),
                                     ("presence_penalty", self.presence_penalty or 0, 0),
                                     ("logit_bias", self.logit_bias or None, None), *self._only_defaults()):
            if value != default:
                raise InvalidInputError(f"{name}={value!r} is not supported (only {default!r})", culprit=name)
        if self.stream_options is not None and not self.stream:
            raise InvalidInputError("stream_options needs stream: true", culprit="stream_options")

    def _only_defaults(self) -> list[tuple[str, Any, Any]]:
        return []

    def stop_sequences(self) -> tuple[str, ...]:
        """The stop strings asked (none: ``()``); a 400 naming ``stop`` for more than
        :data:`MAX_STOPS`, an empty one or one over :data:`MAX_STOP_CHARS` characters."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise InvalidInputError(f"stop: at most {MAX_STOPS} sequences, got {len(stops)}", culprit="stop")
        for s in stops:
            if not s or len(s) > MAX_STOP_CHARS:
                raise InvalidInputError(f"stop: each sequence has 1 to {MAX_STOP_CHARS} characters, got {s!r}",
                                        culprit="stop")
        return tuple(stops)


class CompletionIn(SamplingBody):
    prompt: str | list[int] = Field(min_length=1, description="text, or token ids")
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description=f"default {DEFAULT_MAX_TOKENS}")
    echo: bool | None = Field(None, description="only false")
    logprobs: int | None = Field(None, description="only null")
    best_of: int | None = Field(None, description="only 1")
    suffix: str | None = Field(None, description="only null")

    def _only_defaults(self) -> list[tuple[str, Any, Any]]:
        return [("echo", self.echo or False, False), ("logprobs", self.logprobs, None),
                ("best_of", self.best_of or 1, 1), ("suffix", self.suffix, None)]


class TextPart(OpenAIBody):
    type: Literal["text"]
    text: str


class ChatMessageIn(OpenAIBody):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = Field(None, max_length=256)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionIn(SamplingBody):
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=10_000)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="default: the rest of the context")
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000, description="as max_tokens (wins)")
    logprobs: bool | None = Field(None, description="only false")
    top_logprobs: int | None = Field(None, description="only null")

    def _only_defaults(self) -> list[tuple[str, Any, Any]]:
        return [("logprobs", self.logprobs or False, False), ("top_logprobs", self.top_logprobs, None)]

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


# ---- answers (documented; the routes build plain dicts) ---------------------------------------------
class OpenAIOut(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageOut(OpenAIOut):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoiceOut(OpenAIOut):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None = Field(description="null in a stream's chunks but the last")
    logprobs: None
    token_ids: list[int] | None = Field(None, description="with return_token_ids")


class CompletionOut(OpenAIOut):
    id: str = Field(description="cmpl-<request_id> (GET /v1/requests/{request_id} has its record)")
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoiceOut]
    usage: UsageOut | None = Field(None, description="in a stream: only the last chunk's, with include_usage")


class ChatMessageOut(OpenAIOut):
    role: Literal["assistant"]
    content: str


class ChatChoiceOut(OpenAIOut):
    index: int
    message: ChatMessageOut
    finish_reason: Literal["stop", "length"]
    logprobs: None
    token_ids: list[int] | None = Field(None, description="with return_token_ids")


class ChatCompletionOut(OpenAIOut):
    id: str = Field(description="chatcmpl-<request_id>; a stream's chunks (object chat.completion.chunk) carry "
                                "choices[].delta instead of message")
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoiceOut]
    usage: UsageOut


class ModelCardOut(OpenAIOut):
    id: str = Field(description="the model id (an admin key sees tenant_id/model_id)")
    object: Literal["model"]
    created: int
    owned_by: str = Field(description="its tenant")


class ModelListOut(OpenAIOut):
    object: Literal["list"]
    data: list[ModelCardOut]


class OpenAIErrorDetail(OpenAIOut):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorOut(OpenAIOut):
    error: OpenAIErrorDetail


# ---- conversions -----------------------------------------------------------------------------------
def is_openai_route(request: Request) -> bool:
    """Errors of this request answer in OpenAI's shape (``GET /v1/models``: OpenAI's listing;
    ``POST /v1/models`` stays the deprecated alias of the project's registration)."""
    path = request.url.path
    return path in (COMPLETIONS_PATH, CHAT_PATH) or (
        request.method == "GET" and (path == MODELS_PATH or path.startswith(MODELS_PATH + "/")))


def error_body(status: int, kind: str, message: str, param: str | None = None) -> dict[str, Any]:
    code = {"unauthorized": "invalid_api_key", "not_found": "model_not_found"}.get(kind, kind)
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def finish_reason(tokens: Sequence[int], stop_ids: Sequence[int]) -> Literal["stop", "length"]:
    """``stop``: it ended at a stop id; ``length``: at ``max_tokens``."""
    return "stop" if tokens and tokens[-1] in stop_ids else "length"


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first occurrence of any stop sequence (not included), and whether one
    occurred."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


class StopMatcher:
    """Stream text through the stop sequences: :meth:`push` answers the text that can be sent (a
    tail that could begin a stop sequence is held back until the next text settles it) and
    whether a stop sequence was produced (the stream ends there, the sequence not sent)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""
        self._hold = max((len(s) for s in self.stops), default=1) - 1

    def push(self, text: str) -> tuple[str, bool]:
        held = self._held + text
        cut, hit = cut_at_stop(held, self.stops)
        if hit:
            self._held = ""
            return cut, True
        keep = next((k for k in range(min(self._hold, len(held)), 0, -1)
                     if any(s.startswith(held[-k:]) for s in self.stops)), 0)
        self._held = held[len(held) - keep:] if keep else ""
        return held[:len(held) - keep], False

    def flush(self) -> str:
        """The text held back at the stream's end (no stop sequence came)."""
        held, self._held = self._held, ""
        return held


def usage(req: LiveRequest, completion_tokens: int | None = None) -> dict[str, int]:
    """Token counts; ``completion_tokens`` None: the request's output (a stream cut at a stop
    sequence counts the tokens it had produced)."""
    n = len(req.output_tokens) if completion_tokens is None else completion_tokens
    return {"prompt_tokens": len(req.prompt), "completion_tokens": n, "total_tokens": len(req.prompt) + n}


def answer(req: LiveRequest, model: str, tok: Tokenizer, *, chat: bool, token_ids: bool,
           stops: Sequence[str] = ()) -> dict[str, Any]:
    """The whole answer of a finished request (its text cut at the first stop sequence)."""
    out = req.output_tokens
    text, stopped = cut_at_stop(tok.decode(out), stops)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop" if stopped else finish_reason(out, tok.stop_ids),
                              "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    if token_ids:
        choice["token_ids"] = list(out)
    return {"id": answer_id(req, chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(req.arrival), "model": model, "choices": [choice], "usage": usage(req)}


def answer_id(req: LiveRequest, chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{req.request_id}"


def chunk(req: LiveRequest, model: str, *, chat: bool, text: str | None, finish: str | None = None,
          token_ids: Sequence[int] | None = None, role: bool = False) -> dict[str, Any]:
    """One stream chunk: ``text`` (None: no content), ``finish`` its finish reason (the last)."""
    choice: dict[str, Any] = {"index": 0}
    if chat:
        delta: dict[str, str] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    choice.update(logprobs=None, finish_reason=finish)
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return {"id": answer_id(req, chat), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(req.arrival), "model": model, "choices": [choice]}


def usage_chunk(req: LiveRequest, model: str, *, chat: bool, completion_tokens: int | None = None) -> dict[str, Any]:
    return {"id": answer_id(req, chat), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(req.arrival), "model": model, "choices": [], "usage": usage(req, completion_tokens)}


def sse(data: Mapping[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class IncrementalDecoder:
    """Text from tokens as they come: each :meth:`push` answers the text its tokens complete.
    Text ending in an incomplete character (U+FFFD) waits for the next tokens; the decoded window
    starts at the last complete boundary, so a push costs the window, not the whole output.
    The pieces, with :meth:`flush`, concatenate to ``decode(all tokens)``."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.tokens: list[int] = []
        self._prefix = 0  # the window's first token
        self._read = 0  # tokens whose text was given

    def push(self, tokens: Sequence[int]) -> str:
        self.tokens.extend(tokens)
        before = self.tok.decode(self.tokens[self._prefix:self._read])
        now = self.tok.decode(self.tokens[self._prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        return now[len(before):]

    def flush(self) -> str:
        """The text still held (an incomplete character at the end included)."""
        before = self.tok.decode(self.tokens[self._prefix:self._read])
        now = self.tok.decode(self.tokens[self._prefix:])
        self._prefix = self._read = len(self.tokens)
        return now[len(before):]
