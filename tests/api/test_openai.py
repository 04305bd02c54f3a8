"""The OpenAI-compatible API end to end, driven by the official ``openai`` client: real processes on
loopback (``slicesched serve`` under uvicorn, one ``slicesched executor`` running the models with
PyTorch), the session's Neo4j. One stack for the module; each check compares the served tokens
with the same model (same seed) run in this process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from pydantic import TypeAdapter

from executor.batcher import generate_alone
from service.api.openai import ChatCompletionOut, CompletionOut, ModelListOut
from service.domain.model_config import model_config
from service.domain.sampling import GREEDY, Sampling
from service.domain.tokenizer import BYTES
from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.models.family import DecoderLM, build_model
from tests.api.conftest import reset_live_state


@dataclass
class Setup:
    stack: LiveStack
    key: str  # tenant "oa": models m (tiny) and slow (small-llama)
    other_key: str  # tenant "ob": model secret
    models: dict[str, DecoderLM]  # oa's, as registered (same seeds)

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.stack.url}/v1", api_key=key or self.key, max_retries=0, timeout=60)

    def request(self, request_id: str) -> dict[str, Any]:
        with self.stack.client() as c:
            got: dict[str, Any] = c.get(f"/v1/requests/{request_id}").json()
            return got


@pytest.fixture(autouse=True)
def fresh_live_state() -> None:
    """Override the package's per-test reset: the module shares one stack (reset once, below)."""


@pytest.fixture(scope="module")
def live(neo4j: Neo4jSettings, repo: Any) -> Iterator[Setup]:
    reset_live_state(repo)
    with LiveStack(neo4j=neo4j, lease_ttl_s=2.0, heartbeat_s=0.4) as stack, stack.client() as admin:
        keys = {}
        for tenant, models in (("oa", (("m", "tiny"), ("slow", "small-llama"))), ("ob", (("secret", "tiny"),))):
            r = admin.post("/v1/tenants", json={"tenant_id": tenant})
            assert r.status_code == 201, r.text
            keys[tenant] = r.json()["api_key"]
            for model_id, family in models:
                r = admin.post("/v1/catalog/models", json={"model_id": model_id, "family": family, "tenant_id": tenant})
                assert r.status_code == 201, r.text
        catalog = admin.get("/v1/catalog/models", params={"tenant_id": "oa"}).json()
        models = {m["model_id"]: build_model(model_config(m["family"]), seed=m["seed"]) for m in catalog}
        stack.start_executor("e1", ["cpu:0"])
        stack.wait_devices(1)
        yield Setup(stack, keys["oa"], keys["ob"], models)


def reference(live: Setup, prompt: list[int], n: int, sampling: Sampling = GREEDY, model: str = "m") -> list[int]:
    return generate_alone(live.models[model], prompt, n, sampling)


def same_json(model: Any, body: Any) -> None:
    """The answer is what the route documents (no undeclared key, nothing lost)."""
    adapter = TypeAdapter(model)
    assert adapter.dump_python(adapter.validate_python(body), mode="json", exclude_unset=True) == body


def test_completions_equal_in_process_generation_with_usage(live: Setup) -> None:
    raw = live.client().completions.with_raw_response.create(
        model="m", prompt="Hello, world", max_tokens=12, extra_body={"return_token_ids": True})
    same_json(CompletionOut, raw.http_response.json())
    answer = raw.parse()
    choice = answer.choices[0]
    tokens = reference(live, BYTES.encode("Hello, world"), 12)
    assert choice.model_extra == {"token_ids": tokens} and choice.text == BYTES.decode(tokens)
    assert choice.finish_reason == "length" and answer.model == "m" and answer.id.startswith("cmpl-")
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens,
                                         answer.usage.total_tokens) == (12, 12, 24)
    by_ids = live.client().completions.create(model="m", prompt=[5, 6, 7], max_tokens=4, extra_body={"return_token_ids": True})
    assert by_ids.choices[0].model_extra == {"token_ids": reference(live, [5, 6, 7], 4)}


def test_async_batched_requests_greedy_and_seeded_equal_in_process_generation(live: Setup) -> None:
    seeded = Sampling(temperature=0.8, top_p=0.9, seed=1234)
    prompts = [f"batch mate {i}" for i in range(4)]

    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=f"{live.stack.url}/v1", api_key=live.key, max_retries=0) as client:
            def ask(prompt: str, **kw: Any) -> Any:
                return client.completions.create(model="m", prompt=prompt, max_tokens=16,
                                                 extra_body={"return_token_ids": True}, **kw)
            return list(await asyncio.gather(
                *(ask(p) for p in prompts), ask("seeded", temperature=0.8, top_p=0.9, seed=1234),
                ask("seeded", temperature=0.8, top_p=0.9, seed=1234), ask("seeded", temperature=0.8, seed=99)))

    *greedy, first, again, other = asyncio.run(run())
    for prompt, answer in zip(prompts, greedy, strict=True):
        assert answer.choices[0].model_extra["token_ids"] == reference(live, BYTES.encode(prompt), 16), prompt
    want = reference(live, BYTES.encode("seeded"), 16, seeded)
    assert first.choices[0].model_extra["token_ids"] == want == again.choices[0].model_extra["token_ids"]
    assert other.choices[0].model_extra["token_ids"] != want
    record = live.request(first.id.removeprefix("cmpl-"))
    assert (record["temperature"], record["top_p"], record["seed"]) == (0.8, 0.9, 1234)
    unseeded = live.client().completions.create(model="m", prompt="x", max_tokens=2, temperature=1.0)
    assert live.request(unseeded.id.removeprefix("cmpl-"))["seed"] is not None  # one was chosen, and kept


def test_chat_uses_the_models_chat_template(live: Setup) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    raw = live.client().chat.completions.with_raw_response.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                                  max_completion_tokens=10)
    same_json(ChatCompletionOut, raw.http_response.json())
    answer = raw.parse()
    tokens = reference(live, BYTES.chat(messages), 10)
    assert answer.choices[0].message.content == BYTES.decode(tokens) and answer.choices[0].message.role == "assistant"
    assert answer.id.startswith("chatcmpl-") and answer.usage is not None
    assert answer.usage.prompt_tokens == len(BYTES.chat(messages)) and answer.usage.completion_tokens == 10


def test_streams_send_the_tokens_as_they_come(live: Setup) -> None:
    client = live.client()
    chunks = list(client.completions.create(model="m", prompt="stream me", max_tokens=48, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True}))
    tokens = reference(live, BYTES.encode("stream me"), 48)
    *body, last = chunks
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 48
    assert [t for c in body for t in c.choices[0].model_extra["token_ids"]] == tokens
    assert "".join(c.choices[0].text for c in body) == BYTES.decode(tokens)
    assert sum(1 for c in body if c.choices[0].model_extra["token_ids"]) >= 2  # more than one report
    assert body[-1].choices[0].finish_reason == "length" and all(c.choices[0].finish_reason is None for c in body[:-1])

    messages = [{"role": "user", "content": "and chat"}]
    chat = list(client.chat.completions.create(model="m", messages=messages, max_tokens=20,  # type: ignore[arg-type]
                                               stream=True))
    assert chat[0].choices[0].delta.role == "assistant" and chat[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chat) == BYTES.decode(reference(live, BYTES.chat(messages), 20))


def test_stop_sequences_cut_the_text_whole_and_streamed(live: Setup) -> None:
    """The text ends where the first stop sequence begins (finish_reason "stop"), taken from the
    model's own greedy output so that it occurs; a stream ends there too."""
    client = live.client()
    full = BYTES.decode(reference(live, BYTES.encode("Stop me"), 24))
    stop = full[10:13]
    want = full[:full.find(stop)]
    whole = client.completions.create(model="m", prompt="Stop me", max_tokens=24, stop=[stop, "never-in-it"])
    assert whole.choices[0].text == want and whole.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="m", prompt="Stop me", max_tokens=24, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_errors_raise_the_clients_exception_classes(live: Setup) -> None:
    client = live.client()
    with pytest.raises(openai.AuthenticationError) as auth:
        live.client("nobody-has-this-key").completions.create(model="m", prompt="x", max_tokens=1)
    assert set(auth.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError):  # another tenant's model is not there for this key
        client.chat.completions.create(model="secret", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="n"):
        client.completions.create(model="m", prompt="x", max_tokens=1, n=2)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="m", prompt="x", max_tokens=1, stop=["a", "b", "c", "d", "e"])
    assert bad.value.param == "stop"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[
            {"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.BadRequestError, match="x-slo-ttft-ms"):
        client.completions.create(model="m", prompt="x", max_tokens=1, extra_headers={"x-slo-ttft-ms": "soon"})
    with pytest.raises(openai.BadRequestError, match="context") as long:
        client.completions.create(model="m", prompt="x" * 600, max_tokens=1)
    assert long.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="max_tokens") as over:
        client.completions.create(model="m", prompt="x", max_tokens=100_000)
    assert over.value.param == "max_tokens"
    executor_key = live.stack.executor_key
    with pytest.raises(openai.PermissionDeniedError):
        live.client(executor_key).models.list()


def test_models_are_the_keys_own(live: Setup) -> None:
    listing = live.client().models.with_raw_response.list()
    same_json(ModelListOut, listing.http_response.json())
    assert sorted(m.id for m in listing.parse()) == ["m", "slow"]
    card = live.client().models.retrieve("m")
    assert card.owned_by == "oa" and card.created > 1_600_000_000
    assert [m.id for m in live.client(live.other_key).models.list()] == ["secret"]
    assert sorted(m.id for m in live.client(live.stack.admin_key).models.list()) == ["oa/m", "oa/slow", "ob/secret"]
    with pytest.raises(openai.NotFoundError):
        live.client(live.other_key).models.retrieve("m")


def test_slo_and_priority_headers_reach_the_request(live: Setup) -> None:
    answer = live.client().completions.create(model="m", prompt="urgent", max_tokens=4, extra_headers={
        "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "50", "x-priority": "7"})
    record = live.request(answer.id.removeprefix("cmpl-"))
    assert (record["slo_ttft_s"], record["slo_tpot_s"], record["priority"]) == (0.25, 0.05, 7)
    assert record["sla_class"] == "standard" and record["status"] == "done"


def test_a_client_leaving_mid_stream_cancels_its_request_and_frees_the_executor(live: Setup) -> None:
    live.client().completions.create(model="slow", prompt="warm", max_tokens=1)  # the executor loads the model
    body = {"model": "slow", "prompt": "a long story", "max_tokens": 1000, "stream": True, "return_token_ids": True}
    with httpx.Client(base_url=live.stack.url, headers={"Authorization": f"Bearer {live.key}"}, timeout=60) as c, \
            c.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break  # leave: the response closes with its connection
    deadline = time.monotonic() + 20
    while (record := live.request(request_id))["status"] != "cancelled" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert record["status"] == "cancelled" and len(record["output_tokens"]) == 0
    query = "MATCH (s:Slice {state: 'cancelled'})-[:SERVES]->(:Request {uid: $r}) RETURN s.uid"
    log = live.stack.log_dir / "executor-e1.log"
    with live.stack.client() as admin:
        while not (rows := admin.post("/v1/inspect", json={"query": query, "params": {"r": request_id}}).json()["rows"]):
            assert time.monotonic() < deadline, "the cancelled lease never reached the GMG"
            time.sleep(0.2)
        ((lease_id,),) = rows
        while f"lease {lease_id} cancelled by the service" not in log.read_text():
            assert time.monotonic() < deadline, "the executor never dropped the lease"
            time.sleep(0.1)
        stats = admin.get("/v1/stats").json()
    assert all(r["leases"] == 0 for r in stats["replicas"] if r["model"] == "oa/slow")
    after = live.client().completions.create(model="slow", prompt="next", max_tokens=3, extra_body={"return_token_ids": True})
    assert after.choices[0].model_extra["token_ids"] == reference(live, BYTES.encode("next"), 3, model="slow")
