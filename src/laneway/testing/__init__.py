"""Real processes for tests and benchmarks: ``laneway serve``, the stand-in engine, a
vLLM server and ``redis-server``, each on 127.0.0.1 (a free port), its output in a log
file, stopped when its block ends.

Shipped for the project's tests and benchmarks, and for anyone who wants to drive a
real server from a test of their own.
"""

from laneway.testing.process import START_TIMEOUT_S, cpu_seconds, exit_on_sigterm, free_port, terminate
from laneway.testing.redis_server import RedisProcess, redis_process
from laneway.testing.serve import URL, ServeProcess, StandInProcess, serve_process, standin_process
from laneway.testing.vllm_server import (
    VLLM_MAX_MODEL_LEN,
    VLLM_MODEL_NAME,
    VLLM_START_TIMEOUT_S,
    VllmProcess,
    vllm_process,
)

__all__ = [
    "START_TIMEOUT_S",
    "URL",
    "VLLM_MAX_MODEL_LEN",
    "VLLM_MODEL_NAME",
    "VLLM_START_TIMEOUT_S",
    "RedisProcess",
    "ServeProcess",
    "StandInProcess",
    "VllmProcess",
    "cpu_seconds",
    "exit_on_sigterm",
    "free_port",
    "redis_process",
    "serve_process",
    "standin_process",
    "terminate",
    "vllm_process",
]
