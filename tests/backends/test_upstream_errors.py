"""An upstream's error answers as the client's: a 404 is the model's only where the upstream
says so, else its missing route's; an error page is quoted, escaped where it could be
markup, its quotes kept."""

from __future__ import annotations

import json

import pytest

from laneway.backends.upstream_errors import describe_body, error_from, relay_error
from laneway.errors import InvalidRequest, ModelNotFound, NotFound

VLLM_NO_MODEL = {
    "error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model"}
}
OLD_VLLM_NO_MODEL = {"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError"}


@pytest.mark.parametrize("answer", [VLLM_NO_MODEL, OLD_VLLM_NO_MODEL])
def test_a_404_about_the_model_is_model_not_found(answer: dict[str, object]) -> None:
    got = error_from(404, json.dumps(answer).encode(), "up", b"application/json", "embeddings")
    assert isinstance(got, ModelNotFound) and got.code == "model_not_found"
    assert str(got) == "upstream up: The model `x` does not exist."


def test_the_field_an_upstreams_400_names_is_the_clients() -> None:
    answer = {
        "error": {"message": "tools are not served here", "type": "invalid_request_error", "param": "tools"}
    }
    got = error_from(400, json.dumps(answer).encode(), "up", b"application/json", "chat/completions")
    assert isinstance(got, InvalidRequest) and got.param == "tools"
    assert error_from(404, json.dumps(VLLM_NO_MODEL).encode(), "up").param == "model"  # type: ignore[attr-defined]
    odd = {"error": {"message": "no", "param": 7}}  # (not a field's name: none)
    assert error_from(400, json.dumps(odd).encode(), "up").param is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("code", "passed"),
    [("context_length_exceeded", "context_length_exceeded"), (400, None), ("<b>x</b>", None), ("", None)],
)
def test_an_upstreams_400_keeps_its_code_where_it_is_a_word(code: object, passed: str | None) -> None:
    answer = {"error": {"message": "too long", "param": "messages", "code": code}}
    got = error_from(400, json.dumps(answer).encode(), "up", b"application/json", "chat/completions")
    assert isinstance(got, InvalidRequest) and got.code == passed and got.param == "messages"


@pytest.mark.parametrize(
    ("raw", "ctype", "says"),
    [
        (b'{"detail":"Not Found"}', b"application/json", "HTTP 404: Not Found"),  # FastAPI's
        (b"Not Found", b"text/plain", "HTTP 404: HTTP 404, text/plain, 9 bytes: Not Found"),  # Starlette's
    ],
)
def test_a_404_of_a_missing_route_is_not_found_naming_it(raw: bytes, ctype: bytes, says: str) -> None:
    got = error_from(404, raw, "up", ctype, "embeddings")
    assert isinstance(got, NotFound) and got.status == 404 and got.code == "not_found"
    assert str(got) == f"upstream up does not serve POST /embeddings ({says})"


def test_a_quoted_body_escapes_markup_but_not_quotes() -> None:
    said = describe_body(b'<b onclick="x()">it\'s "gone"</b>', b"text/html")
    assert said == 'text/html, 32 bytes: &lt;b onclick="x()"&gt;it\'s "gone"&lt;/b&gt;'


@pytest.mark.parametrize("status", [404, 405])
def test_a_relayed_path_the_upstream_does_not_serve_is_not_found_naming_it(status: int) -> None:
    """vLLM answers ``POST /v1/responses/input_tokens`` with a 405 (its ``/v1/responses/{id}``
    takes GET and DELETE): for the client the path is not served, as a 404 says."""
    raw = b'{"detail":"Method Not Allowed"}'
    got = relay_error(status, raw, "up", "responses/input_tokens", b"application/json")
    assert isinstance(got, NotFound) and got.status == 404
    assert str(got).startswith(f"upstream up does not serve POST /responses/input_tokens (HTTP {status}): ")
    assert "Method Not Allowed" in str(got)
    got = relay_error(400, b'{"error": {"message": "bad"}}', "up", "rerank", b"application/json")
    assert not isinstance(got, NotFound) and got.status == 400  # type: ignore[attr-defined]
