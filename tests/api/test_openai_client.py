"""The official openai client works unchanged: sync, async, streaming, chat and completions."""

from __future__ import annotations

import asyncio

import httpx
import openai

from live_server import LiveServer


def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


def test_chat_completion_with_extension(sim_server: LiveServer) -> None:
    r = client(sim_server).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body={"priority": "P0"}
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and len(r.choices[0].message.content.split()) == 4
    assert r.usage is not None and r.usage.completion_tokens == 4
    ext = r.model_extra["laneway"]
    assert ext["priority"] == "P0" and ext["preemptions"] == 0 and ext["worker"] == "sim0"
    assert ext["queue_ms"] >= 0
    assert ext["resume"] == "none"  # P0 is never preempted: nothing to resume


def test_completion_and_priority_sources(sim_server: LiveServer) -> None:
    c = client(sim_server)
    r = c.completions.create(model="sim", prompt="hello", max_tokens=3)
    assert r.object == "text_completion" and r.choices[0].text.count(" ") == 3
    assert r.model_extra["laneway"]["priority"] == "P1"  # the server default
    r = c.completions.create(model="sim", prompt="x", max_tokens=1, extra_headers={"X-Laneway-Priority": "3"})
    assert r.model_extra["laneway"]["priority"] == "P3"
    assert r.model_extra["laneway"]["resume"] == "checkpoint"  # (the simulated worker's)
    r = c.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "x"}], max_tokens=1, service_tier="flex"
    )
    assert r.model_extra["laneway"]["priority"] == "P2"
    assert r.service_tier == "flex"  # (said back, as OpenAI does: the tier it ran in)
    r = c.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "x"}], max_tokens=1, service_tier="auto"
    )
    assert r.service_tier == "default"
    stream = c.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        service_tier="flex",
        stream=True,
    )
    assert {chunk.service_tier for chunk in stream} == {"flex"}
    plain = c.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert plain.service_tier is None  # (none asked for)
    r = c.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=1,
        service_tier="priority",
        extra_body={"priority": 2, "preemptible": False},  # the body field wins
    )
    assert r.model_extra["laneway"]["priority"] == "P2"
    assert r.model_extra["laneway"]["resume"] == "none"  # (it opted out of preemption)


def test_streaming_chat_with_usage(sim_server: LiveServer) -> None:
    stream = client(sim_server).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    ended = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    # the laneway object is on the finishing chunk and on the last one
    assert ended.model_extra["laneway"] == chunks[-1].model_extra["laneway"]
    assert chunks[-1].model_extra["laneway"]["priority"] == "P1"  # (the default class)


def test_streaming_completion_ends_with_done(sim_server: LiveServer) -> None:
    chunks = list(client(sim_server).completions.create(model="sim", prompt="p", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks).count(" ") == 3
    with httpx.stream(
        "POST",
        sim_server.base_url + "/completions",
        json={"model": "sim", "prompt": "p", "max_tokens": 2, "stream": True},
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_async_client(sim_server: LiveServer) -> None:
    async def main() -> None:
        c = openai.AsyncOpenAI(base_url=sim_server.base_url, api_key="unused", max_retries=0, timeout=30)
        asks = [
            c.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": f"{i}"}], max_tokens=3
            )
            for i in range(5)
        ]
        rs = await asyncio.gather(*asks)
        assert all(r.usage.completion_tokens == 3 for r in rs)
        stream = await c.completions.create(model="sim", prompt="a", max_tokens=2, stream=True)
        parts = [ch.choices[0].text async for ch in stream]
        assert "".join(parts).count(" ") == 2
        await c.close()

    asyncio.run(main())


def test_models_and_estimate(sim_server: LiveServer) -> None:
    models = client(sim_server).models.list()
    assert [m.id for m in models.data] == ["sim"]
    r = httpx.get(sim_server.base_url + "/queue/estimate", params={"priority": "P1", "model": "sim"})
    assert r.status_code == 200
    body = r.json()
    assert body["priority"] == "P1" and body["estimated_wait_s"] >= 0
    # an idle server: a slot is free now (its interval and what it rests on are said)
    assert body["basis"] == "now" and body["estimated_wait_range_s"] == [0.0, 0.0], body
    assert httpx.get(sim_server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(sim_server.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["workers"]["sim0"]["ok"]
