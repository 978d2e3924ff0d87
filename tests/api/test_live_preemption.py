"""Live preemption on the in-process engine (builtin:tiny, 1 slot).

A long greedy P3 request runs; a P0 arrives and is answered while the P3
waits; the P3 then resumes from its checkpoint and its final text equals the
text of the same request run alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import openai

from laneway.config import ServerConfig
from live_server import live_server, tiny

P3_PROMPT = "long"  # greedy on builtin:tiny: hundreds of tokens before it stops
P3_TOKENS = 100


def test_p0_preempts_p3_and_p3_text_is_unchanged(tmp_path: Path) -> None:
    cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path)
    with live_server(cfg) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)

        def p3() -> openai.types.Completion:
            return c.completions.create(
                model="builtin:tiny",
                prompt=P3_PROMPT,
                max_tokens=P3_TOKENS,
                temperature=0,
                extra_body={"priority": "P3"},
            )

        alone = p3()
        assert alone.usage.completion_tokens == P3_TOKENS  # long enough to be caught running
        result: list[openai.types.Completion] = []
        ended: list[float] = []

        def background() -> None:
            result.append(p3())
            ended.append(time.monotonic())

        t = threading.Thread(target=background)
        t.start()
        try:
            deadline = time.monotonic() + 30
            # wait until the P3 runs and has written a few tokens
            while time.monotonic() < deadline:
                running = [tk for tk in list(server.runtime.tickets.values()) if tk.tokens >= 5]
                if running:
                    break
                time.sleep(0.005)
            assert running, "the P3 request never started"
            p0 = c.chat.completions.create(
                model="builtin:tiny",
                messages=[{"role": "user", "content": "urgent"}],
                max_tokens=5,
                temperature=0,
                extra_body={"priority": "P0"},
            )
            p0_done = time.monotonic()
            assert p0.model_extra["laneway"]["priority"] == "P0"
        finally:
            t.join(120)
        [resumed] = result
        assert p0_done < ended[0], "the P3 request finished before the P0 was answered"
        ext = resumed.model_extra["laneway"]
        assert ext["priority"] == "P3" and ext["preemptions"] >= 1
        assert resumed.choices[0].text == alone.choices[0].text
        assert resumed.usage.completion_tokens == P3_TOKENS
