"""The external contract the tests pin down (DESIGN §3), written once for every test.

Kept apart from the code under test on purpose: the tests state the contract,
the code must meet it.
"""

# the `--json` object of `laneway simulate`
DESIGN_KEYS = frozenset(
    {
        "policy",
        "scenario",
        "classes",
        "preemptions",
        "model_loads",
        "utilization",
        "makespan_s",
        "estimate_error_median",
    }
)
DESIGN_CLASS_KEYS = frozenset(
    {
        "count",
        "completed",
        "rejected",
        "wait_mean_s",
        "wait_p50_s",
        "wait_p95_s",
        "wait_p99_s",
        "wait_max_s",
        "latency_p99_s",
    }
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
