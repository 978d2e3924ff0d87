"""The live requests: submitted and not ended yet, by id, and the count of submissions
(each request's sequence number, the last key of the total order)."""

from __future__ import annotations

from laneway.core.admission import Admission
from laneway.core.errors import UnknownRequest
from laneway.core.inheritance import Inheritance
from laneway.core.request import Request


class Live:
    __slots__ = ("admission", "inheritance", "reqs", "seq")

    def __init__(self, reqs: dict[str, Request], admission: Admission, inheritance: Inheritance) -> None:
        self.reqs = reqs
        self.seq = 0  # submissions so far
        self.admission = admission
        self.inheritance = inheritance

    def get(self, request_id: str) -> Request:
        try:
            return self.reqs[request_id]
        except KeyError:
            raise UnknownRequest(f"unknown request {request_id!r}") from None

    def number(self, req: Request) -> None:
        """``req`` is submitted: its sequence number."""
        req.seq = self.seq
        self.seq += 1

    def end(self, req: Request) -> None:
        """``req`` ended (its state says how): it is no longer live."""
        del self.reqs[req.id]
        if req.tenant is not None:
            self.admission.on_end(req.tenant)
        if req.depends_on:
            self.inheritance.ended(req)
