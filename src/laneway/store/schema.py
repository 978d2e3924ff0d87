"""Every table, index and SQL statement of the SQLite store, in one place.

Four tables: ``files`` (uploaded inputs and generated outputs), ``batches``
(one row per batch, OpenAI's fields plus the class and the tenant),
``batch_lines`` (one row per input line: its state, attempts, the lease of the
process running it, and its result) and ``responses`` (the Responses API's
stored answers, by tenant and id). ``UNIQUE (batch_id, custom_id)`` means a
custom_id has one row, hence at most one result; a trigger refuses to
overwrite a result once written.
"""

from __future__ import annotations

SCHEMA_VERSION = 3  # 2: batches count their lines' tokens; 3: stored responses
DB_NAME = "laneway.db"

FILES = "files"
BATCHES = "batches"
LINES = "batch_lines"
RESPONSES = "responses"

CREATE = (
    f"""CREATE TABLE IF NOT EXISTS {FILES} (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        content BLOB NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {FILES}_by_tenant ON {FILES} (tenant, seq)",
    f"""CREATE TABLE IF NOT EXISTS {BATCHES} (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        priority INTEGER NOT NULL,
        status TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        in_progress_at INTEGER,
        finalizing_at INTEGER,
        completed_at INTEGER,
        failed_at INTEGER,
        expired_at INTEGER,
        cancelling_at INTEGER,
        cancelled_at INTEGER,
        output_file_id TEXT,
        error_file_id TEXT,
        total INTEGER NOT NULL DEFAULT 0,
        completed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        errors TEXT,
        metadata TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0
    )""",
    f"CREATE INDEX IF NOT EXISTS {BATCHES}_by_tenant ON {BATCHES} (tenant, seq)",
    f"CREATE INDEX IF NOT EXISTS {BATCHES}_by_status ON {BATCHES} (status)",
    f"""CREATE TABLE IF NOT EXISTS {LINES} (
        batch_id TEXT NOT NULL,
        line_no INTEGER NOT NULL,
        custom_id TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        owner TEXT,
        lease_until REAL,
        not_before REAL NOT NULL DEFAULT 0,
        result TEXT,
        PRIMARY KEY (batch_id, line_no),
        UNIQUE (batch_id, custom_id)
    )""",
    f"CREATE INDEX IF NOT EXISTS {LINES}_by_state ON {LINES} (batch_id, state, line_no)",
    f"CREATE INDEX IF NOT EXISTS {LINES}_by_owner ON {LINES} (owner) WHERE owner IS NOT NULL",
    f"""CREATE TRIGGER IF NOT EXISTS {LINES}_result_once
        BEFORE UPDATE OF result ON {LINES}
        WHEN OLD.result IS NOT NULL
        BEGIN SELECT RAISE(ABORT, 'a line result is written once'); END""",
    f"""CREATE TABLE IF NOT EXISTS {RESPONSES} (
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (tenant, id)
    )""",
)

# what brings a store of an earlier version up to date, by the version it has
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        f"ALTER TABLE {BATCHES} ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {BATCHES} ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0",
    ),
    2: (),  # (the responses table: made by CREATE, as on a new store)
}

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",  # WAL + NORMAL: a commit survives a process crash
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=5000",
)

# --- files
INSERT_FILE = (
    f"INSERT INTO {FILES} (id, tenant, purpose, filename, bytes, created_at, content) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
FILE_COLUMNS = "id, tenant, purpose, filename, bytes, created_at"
GET_FILE = f"SELECT {FILE_COLUMNS} FROM {FILES} WHERE id = ? AND tenant = ?"
GET_FILE_CONTENT = f"SELECT content FROM {FILES} WHERE id = ? AND tenant = ?"
DELETE_FILE = f"DELETE FROM {FILES} WHERE id = ? AND tenant = ?"
LIST_FILES = (
    f"SELECT {FILE_COLUMNS} FROM {FILES} WHERE tenant = ? AND seq < ? {{purpose}} ORDER BY seq DESC LIMIT ?"
)
LIST_FILES_OLDEST = (
    f"SELECT {FILE_COLUMNS} FROM {FILES} WHERE tenant = ? AND seq > ? {{purpose}} ORDER BY seq ASC LIMIT ?"
)
FILE_SEQ = f"SELECT seq FROM {FILES} WHERE id = ? AND tenant = ?"

# --- stored responses (the Responses API): one JSON record per tenant and id
PUT_RESPONSE = f"INSERT OR REPLACE INTO {RESPONSES} (id, tenant, created_at, record) VALUES (?, ?, ?, ?)"
GET_RESPONSE = f"SELECT record FROM {RESPONSES} WHERE id = ? AND tenant = ?"
DELETE_RESPONSE = f"DELETE FROM {RESPONSES} WHERE id = ? AND tenant = ?"

# --- batches
BATCH_COLUMNS = (
    "id, tenant, endpoint, input_file_id, completion_window, priority, status, created_at, expires_at, "
    "in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at, "
    "output_file_id, error_file_id, total, completed, failed, errors, metadata, input_tokens, output_tokens"
)
INSERT_BATCH = (
    f"INSERT INTO {BATCHES} (id, tenant, endpoint, input_file_id, completion_window, priority, status, "
    "created_at, expires_at, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
GET_BATCH = f"SELECT {BATCH_COLUMNS} FROM {BATCHES} WHERE id = ?"
GET_TENANT_BATCH = f"SELECT {BATCH_COLUMNS} FROM {BATCHES} WHERE id = ? AND tenant = ?"
LIST_BATCHES = f"SELECT {BATCH_COLUMNS} FROM {BATCHES} WHERE tenant = ? AND seq < ? ORDER BY seq DESC LIMIT ?"
BATCH_SEQ = f"SELECT seq FROM {BATCHES} WHERE id = ? AND tenant = ?"
BATCHES_IN = f"SELECT {BATCH_COLUMNS} FROM {BATCHES} WHERE status IN ({{marks}}) ORDER BY seq"
# {stamp} is the status's timestamp column (from the transition table, never user input)
SET_STATUS = f"UPDATE {BATCHES} SET status = ?, {{stamp}} = ? WHERE id = ? AND status IN ({{marks}})"
# a batch cancelled while it was validated (never started) is still given its lines (each to
# be answered batch_cancelled: every custom_id in one of its two files), or fails with its errors
_UNSTARTED = "(status = 'validating' OR (status = 'cancelling' AND in_progress_at IS NULL))"
START_BATCH = (
    f"UPDATE {BATCHES} SET in_progress_at = CASE status WHEN 'validating' THEN ? END, "
    "status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, total = ? "
    f"WHERE id = ? AND {_UNSTARTED} AND NOT EXISTS (SELECT 1 FROM {LINES} WHERE batch_id = {BATCHES}.id)"
)
FAIL_BATCH = (
    f"UPDATE {BATCHES} SET status = 'failed', failed_at = ?, errors = ?, error_file_id = ? "
    f"WHERE id = ? AND {_UNSTARTED}"
)
COUNT_DONE = (
    f"UPDATE {BATCHES} SET completed = completed + 1, input_tokens = input_tokens + ?, "
    "output_tokens = output_tokens + ? WHERE id = ?"
)
COUNT_FAILED = f"UPDATE {BATCHES} SET failed = failed + ? WHERE id = ?"
SET_OUTPUTS = (
    f"UPDATE {BATCHES} SET status = ?, {{stamp}} = ?, output_file_id = ?, error_file_id = ? "
    "WHERE id = ? AND status IN ({marks})"
)

# --- lines
INSERT_LINE = f"INSERT INTO {LINES} (batch_id, line_no, custom_id, body, state) VALUES (?, ?, ?, ?, 'queued')"
CLAIMABLE_QUEUED = (
    f"SELECT line_no FROM {LINES} WHERE batch_id = ? AND state = 'queued' AND not_before <= ? "
    "ORDER BY line_no LIMIT ?"
)
CLAIMABLE_EXPIRED = (
    f"SELECT line_no FROM {LINES} WHERE batch_id = ? AND state = 'running' AND lease_until < ? "
    "ORDER BY line_no LIMIT ?"
)
CLAIM = (
    f"UPDATE {LINES} SET state = 'running', owner = ?, lease_until = ?, attempts = attempts + 1 "
    "WHERE batch_id = ? AND line_no = ? RETURNING line_no, custom_id, body, attempts"
)
RENEW = (
    f"UPDATE {LINES} SET lease_until = ? "
    "WHERE batch_id = ? AND line_no = ? AND owner = ? AND state = 'running'"
)
FINISH = (
    f"UPDATE {LINES} SET state = ?, result = ?, owner = NULL, lease_until = NULL "
    "WHERE batch_id = ? AND line_no = ? AND state = 'running' AND owner = ?"
)
RELEASE = (
    f"UPDATE {LINES} SET state = 'queued', owner = NULL, lease_until = NULL, not_before = ?, "
    "attempts = attempts - ? WHERE batch_id = ? AND line_no = ? AND state = 'running' AND owner = ?"
)
RELEASE_OWNER = (  # an orderly stop: the interrupted run does not count as an attempt
    f"UPDATE {LINES} SET state = 'queued', owner = NULL, lease_until = NULL, attempts = MAX(attempts - 1, 0) "
    "WHERE owner = ? AND state = 'running'"
)
RELEASE_ALL = f"UPDATE {LINES} SET state = 'queued', owner = NULL, lease_until = NULL WHERE state = 'running'"
PENDING = f"SELECT COUNT(*) FROM {LINES} WHERE batch_id = ? AND state IN ('queued', 'running')"
LEFTOVERS = f"SELECT line_no, custom_id FROM {LINES} WHERE batch_id = ? AND state IN ('queued', 'running')"
FAIL_LEFTOVER = (
    f"UPDATE {LINES} SET state = 'failed', result = ?, owner = NULL, lease_until = NULL "
    "WHERE batch_id = ? AND line_no = ? AND state IN ('queued', 'running')"
)
RESULTS = (
    f"SELECT state, result FROM {LINES} WHERE batch_id = ? AND state IN ('done', 'failed') ORDER BY line_no"
)
LINE_STATES = (
    f"SELECT line_no, custom_id, state, attempts, result FROM {LINES} WHERE batch_id = ? ORDER BY line_no"
)
