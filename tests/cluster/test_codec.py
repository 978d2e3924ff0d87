"""The cluster's messages: every kind survives the wire (JSON) unchanged, the wire form is
the one earlier versions wrote (a replica and a leader of two versions understand each
other), a table entry is an object of named fields (and one written as a list is read),
and what is not a message is refused by name, not by an IndexError deep in the leader."""

from __future__ import annotations

import json
import math

import pytest

from laneway.cluster import codec
from laneway.cluster.codec import (
    AdapterFailed,
    AdapterTook,
    Availability,
    BadMessage,
    CachedOn,
    CacheLost,
    CacheSpace,
    Cancelled,
    Census,
    CensusAsked,
    EngineGone,
    EngineReady,
    Finished,
    FirstToken,
    LoanGranted,
    LoanTaken,
    ModelFailing,
    Owns,
    Pace,
    Preempted,
    Progress,
    Reload,
    Requeued,
    Sent,
    SlotsWanted,
    Submitted,
    TableEntry,
    decode_event,
    decode_order,
    encode,
)
from laneway.core import Dispatch, Evict, Load, Preempt, Reject, Request, StopMode
from laneway.core.decisions import LoadAdapter, UnloadAdapter

SENT = Sent("r1", "r1.abc", 2, 1796225000.5, "m", "acme", False, 30.0, 4.5, 120, 64)
PREFIXED = Sent("r2", "r1.abc", 0, 1796225001.0, "m", prompt_tokens=900, prefix=(2**63 + 5, 17, 0))

EVENTS = [
    Submitted(SENT),
    Submitted(PREFIXED),
    Finished("r1", True, 12, 100),
    Finished("r1"),
    Cancelled("r1", 3),
    Preempted("r1", 10, 4096, 0.01),
    Requeued("r1"),
    Requeued("r1", failed=True),
    Progress("r1", 7),
    FirstToken("r1"),
    Availability("up0", False),
    CacheSpace("up0", 23_296),
    CacheLost("up0"),
    CachedOn("up0", (2**63 - 1, 12, 7)),
    Pace("m", 57, 1.25),
    SlotsWanted("r1.abc", "m"),
    LoanTaken("r1.abc", "up0", 4, 2),
    Census("tok:1", "r1.abc", (TableEntry(SENT), TableEntry(PREFIXED, codec.RUNNING, "up0"))),
    Owns("node-a", "r1.abc"),
    EngineReady("chat#3@a0+a1", "chat", ("a0", "a1"), 41.5, False, True),
    EngineReady("chat#4@b0", "chat", ("b0",), 2.0, True),
    EngineGone("chat#3@a0+a1", "chat"),
    EngineGone("chat#4@b0", "chat", True),
    ModelFailing("chat", "exited with status 1", 10.0),
    AdapterTook("sql", 0.25),
    AdapterFailed("chat#4@b0", "sql"),
    Reload("chat"),
]
ORDERS = [
    Dispatch("r1", "up0", None),
    Dispatch("r1", "up0", StopMode.RECOMPUTE),
    Preempt("r1", "up0", StopMode.CHECKPOINT, 0),
    Reject("r1", "queue_timeout", "late", 12.5, 12.5),
    LoanGranted("up0", 3, 9),
    CensusAsked("tok:2"),
    Load("chat#3@a0+a1", "chat", ("a0", "a1"), 45.0),
    Load("chat#4@b0", "chat", ("b0",), 3.0, True),
    Evict("chat#4@b0", "chat", ("b0",)),
    Evict("chat#4@b0", "chat", ("b0",), True),
    LoadAdapter("chat#4@b0", "sql", 0.5),
    UnloadAdapter("chat#4@b0", "sql"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_survives_the_wire(event: object) -> None:
    assert decode_event(json.loads(json.dumps(encode(event)))) == event  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ORDERS, ids=lambda e: type(e).__name__)
def test_every_order_survives_the_wire(order: object) -> None:
    assert decode_order(json.loads(json.dumps(encode(order)))) == order  # type: ignore[arg-type]


def test_an_unknown_wait_goes_as_null_and_comes_back_infinite() -> None:
    wire = encode(Reject("r1", "queue_timeout", "no leader", math.inf, 5.0))
    assert json.dumps(wire, allow_nan=False)  # (standard JSON)
    back = decode_order(json.loads(json.dumps(wire)))
    assert isinstance(back, Reject) and back.estimated_wait_s == math.inf and back.retry_after_s == 5.0


def test_the_wire_is_what_earlier_versions_wrote() -> None:
    fields = ["r1", "r1.abc", 2, 1796225000.5, "m", "acme", False, 30.0, 4.5, 120, 64]
    assert encode(Submitted(SENT)) == ["s", *fields, []]  # (its prompt's prefix last: none)
    assert decode_event(["s", *fields]) == Submitted(SENT)  # sent before prefixes were
    assert encode(Finished("r1", False, 5, None)) == ["f", "r1", False, 5, None]
    assert encode(Preempted("r1", 1, 2, 0.5)) == ["p", "r1", 1, 2, 0.5]
    assert encode(LoanTaken("h", "w", 3, 1)) == ["u", "h", "w", 3, 1]
    assert encode(LoanGranted("w", 2, 3)) == ["G", "w", 2, 3]
    assert encode(CachedOn("w", (5, 6))) == ["l", "w", [5, 6]]
    assert encode(Dispatch("r1", "w", None)) == ["D", "r1", "w", None]
    # an end sent before ends carried token counts
    assert decode_event(["f", "r1", 0]) == Finished("r1", False, None, None)
    assert decode_event(["c", "r1"]) == Cancelled("r1", None)


def test_a_table_entry_is_named_and_one_written_as_a_list_is_read() -> None:
    entry = TableEntry(SENT, codec.RUNNING, "up0")
    data = entry.to_json()
    assert data["id"] == "r1" and data["state"] == "r" and data["worker"] == "up0"
    assert TableEntry.from_json(json.loads(json.dumps(data))) == entry
    old = [*encode(Submitted(SENT)), "r", "up0"]  # how the table was written before
    assert TableEntry.from_json(old) == entry
    assert TableEntry.from_json([*old[:-3], "r", "up0"]) == entry  # ... before prefixes were
    prefixed = TableEntry(PREFIXED, codec.QUEUED, None)
    assert TableEntry.from_json(json.loads(json.dumps(prefixed.to_json()))) == prefixed
    more = {**data, "a_field_of_a_later_version": 1}  # a field added does not move the others
    assert TableEntry.from_json(more) == entry


def test_a_sent_request_is_made_again_as_it_was() -> None:
    for sent in (SENT, PREFIXED):
        req = sent.request()
        assert isinstance(req, Request)
        assert Sent.of(req, sent.home) == sent


@pytest.mark.parametrize(
    "bad", [[], "s", ["?", 1], ["f"], ["g", "r1", "many"], ["K", "x", "h", [["s", "r1"]]], {"s": 1}]
)
def test_what_is_not_a_message_is_refused_by_name(bad: object) -> None:
    with pytest.raises(BadMessage):
        decode_event(bad)  # type: ignore[arg-type]
