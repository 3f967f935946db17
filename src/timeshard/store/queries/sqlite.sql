-- The embedded store's named queries. The conditions of each conditional write are checked in
-- the same transaction (one writer thread), so they hold exactly as Cassandra's IF clauses do.

-- name: schema
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL,
    type TEXT NOT NULL,
    payload BLOB NOT NULL,
    state TEXT NOT NULL,
    run_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    fence INTEGER NOT NULL,
    lease_owner TEXT NOT NULL,
    lease_until INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL,
    last_error TEXT NOT NULL,
    history TEXT NOT NULL,
    result BLOB NOT NULL DEFAULT x'',
    result_encoding TEXT NOT NULL DEFAULT '',
    deadline INTEGER NOT NULL DEFAULT 0,
    priority INTEGER NOT NULL DEFAULT 0,
    unstarted INTEGER NOT NULL DEFAULT 0,
    start_noticed INTEGER NOT NULL DEFAULT 0
);
-- A listing by state walks this index (in_states below); keyed by due time, a claim or a result
-- moves a job's entry among neighbours of jobs due at the same time (few pages written per
-- commit). It replaces jobs_by_state (state, type, job_id), which no query used.
DROP INDEX IF EXISTS jobs_by_state;
CREATE INDEX IF NOT EXISTS jobs_by_state_due ON jobs (state, run_at, job_id);
CREATE TABLE IF NOT EXISTS buckets (
    shard INTEGER NOT NULL,
    minute INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (shard, minute, due_at, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shards (
    shard INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    owner TEXT NOT NULL,
    cursor INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS schedules (
    schedule_id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    dst_gap TEXT NOT NULL,
    dst_fold TEXT NOT NULL,
    type TEXT NOT NULL,
    payload BLOB NOT NULL,
    max_attempts INTEGER NOT NULL,
    misfire TEXT NOT NULL,
    misfire_grace_ms INTEGER NOT NULL,
    max_catchup INTEGER NOT NULL,
    overlap TEXT NOT NULL,
    max_concurrent INTEGER NOT NULL,
    jitter_ms INTEGER NOT NULL,
    paused INTEGER NOT NULL,
    next_fire INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    version INTEGER NOT NULL,
    active TEXT NOT NULL,
    queued_at INTEGER NOT NULL,
    skipped INTEGER NOT NULL,
    last_skip_at INTEGER NOT NULL,
    last_fire_at INTEGER NOT NULL,
    spread_ms INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0
);
-- A schedule's revisions (store/codec.py revision_record), the newest REVISIONS_KEPT of each;
-- written in the transaction of the change that made each, kept when the schedule is deleted.
CREATE TABLE IF NOT EXISTS schedule_revisions (
    schedule_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (schedule_id, revision)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS schedule_ledger (
    schedule_id TEXT NOT NULL,
    nominal INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    row TEXT NOT NULL,
    PRIMARY KEY (schedule_id, nominal)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS schedule_ledger_expiry ON schedule_ledger (expires_at);
CREATE TABLE IF NOT EXISTS audit (
    at INTEGER NOT NULL,
    id TEXT NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (at, id)
);

-- name: job_columns
-- What an existing database's jobs table has (a migration adds what is missing).
SELECT name FROM pragma_table_info('jobs');

-- name: add_result
-- Migration: a handler's result, on a database made before results were stored.
ALTER TABLE jobs ADD COLUMN result BLOB NOT NULL DEFAULT x'';

-- name: add_result_encoding
ALTER TABLE jobs ADD COLUMN result_encoding TEXT NOT NULL DEFAULT '';

-- name: add_deadline
-- Migration: a job's deadline (0: none) and priority, on a database made before them.
ALTER TABLE jobs ADD COLUMN deadline INTEGER NOT NULL DEFAULT 0;

-- name: add_priority
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

-- name: add_unstarted
-- Migration: deliveries without a handler start, and the running attempt's start notice.
ALTER TABLE jobs ADD COLUMN unstarted INTEGER NOT NULL DEFAULT 0;

-- name: add_start_noticed
ALTER TABLE jobs ADD COLUMN start_noticed INTEGER NOT NULL DEFAULT 0;

-- name: schedule_columns
SELECT name FROM pragma_table_info('schedules');

-- name: add_spread
-- Migration: a schedule's spread window (0: none).
ALTER TABLE schedules ADD COLUMN spread_ms INTEGER NOT NULL DEFAULT 0;

-- name: add_schedule_revision
-- Migration: a schedule's revision (0: written before revisions were kept) and whether it was
-- deleted (its row stays while its revisions are kept).
ALTER TABLE schedules ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;

-- name: add_schedule_deleted
ALTER TABLE schedules ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;

-- name: select_job
-- The columns in the order of Job's fields (codec.JOB_COLUMNS): rows decode by position.
SELECT job_id, shard, type, payload, state, run_at, created_at, attempt, max_attempts, fence,
       lease_owner, lease_until, started_at, finished_at, idempotency_key, last_error, history,
       result, result_encoding, deadline, priority, unstarted, start_noticed
FROM jobs WHERE job_id = ?;

-- name: select_jobs
-- Many jobs in one statement: the ids as a JSON array.
SELECT job_id, shard, type, payload, state, run_at, created_at, attempt, max_attempts, fence,
       lease_owner, lease_until, started_at, finished_at, idempotency_key, last_error, history,
       result, result_encoding, deadline, priority, unstarted, start_noticed
FROM jobs WHERE job_id IN (SELECT value FROM json_each(?));

-- name: insert_job
-- A job whose id exists already is left as it is (the caller reads it).
INSERT OR IGNORE INTO jobs (job_id, shard, type, payload, state, run_at, created_at, attempt,
                            max_attempts, fence, lease_owner, lease_until, started_at,
                            finished_at, idempotency_key, last_error, history, result,
                            result_encoding, deadline, priority, unstarted, start_noticed)
VALUES (:job_id, :shard, :type, :payload, :state, :run_at, :created_at, :attempt, :max_attempts,
        :fence, :lease_owner, :lease_until, :started_at, :finished_at, :idempotency_key,
        :last_error, :history, :result, :result_encoding, :deadline, :priority, :unstarted,
        :start_noticed);

-- name: update_job
UPDATE jobs SET state = :state, run_at = :run_at, attempt = :attempt, fence = :fence,
                lease_owner = :lease_owner, lease_until = :lease_until,
                started_at = :started_at, finished_at = :finished_at,
                last_error = :last_error, history = :history, result = :result,
                result_encoding = :result_encoding, unstarted = :unstarted,
                start_noticed = :start_noticed
WHERE job_id = :job_id;

-- name: insert_entry
INSERT OR IGNORE INTO buckets (shard, minute, due_at, job_id) VALUES (?, ?, ?, ?);

-- name: read_bucket
SELECT shard, minute, due_at, job_id FROM buckets
WHERE shard = ? AND minute = ? AND due_at >= ? AND due_at < ? AND (due_at, job_id) > (?, ?)
ORDER BY due_at, job_id LIMIT ?;

-- name: select_key
SELECT job_id, digest FROM idempotency_keys WHERE key = ?;

-- name: insert_key
INSERT OR IGNORE INTO idempotency_keys (key, job_id, digest) VALUES (?, ?, ?);

-- name: jobs_matching
-- The filters of a listing (store.listing.JobQuery), each given (a null parameter: none):
-- {states} is any_state or in_states; :occurrences is '<schedule>@', and the ids from it up to
-- '<schedule>A' ('A' follows '@') are exactly those that start with it. A WHERE clause that
-- find_jobs_by_* and count_jobs share, not run alone.
{states}
  AND (:type IS NULL OR type = :type)
  AND (:due_from IS NULL OR run_at >= :due_from)
  AND (:due_to IS NULL OR run_at < :due_to)
  AND (:key_prefix IS NULL OR substr(idempotency_key, 1, length(:key_prefix)) = :key_prefix)
  AND (:occurrences IS NULL OR (job_id >= :occurrences AND job_id < :occurrences_end))

-- name: any_state
-- The states of a listing that reads every job (:states a JSON array, or null: any state);
-- '+state' keeps the planner off jobs_by_state_due (SqliteStore.select_jobs chooses).
(:states IS NULL OR +state IN (SELECT value FROM json_each(:states)))

-- name: in_states
-- The states of a listing that reads them from jobs_by_state_due: a listing of dead letters
-- does not read every job.
state IN (SELECT value FROM json_each(:states))

-- name: count_in_states
-- How many jobs the states hold, up to a limit, from jobs_by_state_due alone.
SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state IN (SELECT value FROM json_each(?)) LIMIT ?);

-- name: rowid_span
-- At least as many as the jobs stored (rows the sweep deleted leave gaps): two index steps.
SELECT coalesce((SELECT max(rowid) FROM jobs) - (SELECT min(rowid) FROM jobs) + 1, 0);

-- name: find_jobs_by_due
-- A page of a listing, with each job's place in its order last: the matching jobs after the
-- position (:after_value, :after_id) (the first page: -1, ''), by due time, ties by id.
SELECT job_id, shard, type, payload, state, run_at, created_at, attempt, max_attempts, fence,
       lease_owner, lease_until, started_at, finished_at, idempotency_key, last_error, history,
       result, result_encoding, deadline, priority, unstarted, start_noticed, run_at
FROM jobs WHERE ({jobs_matching}) AND (run_at, job_id) > (:after_value, :after_id)
ORDER BY run_at, job_id LIMIT :limit;

-- name: find_jobs_by_created
SELECT job_id, shard, type, payload, state, run_at, created_at, attempt, max_attempts, fence,
       lease_owner, lease_until, started_at, finished_at, idempotency_key, last_error, history,
       result, result_encoding, deadline, priority, unstarted, start_noticed, created_at
FROM jobs WHERE ({jobs_matching}) AND (created_at, job_id) > (:after_value, :after_id)
ORDER BY created_at, job_id LIMIT :limit;

-- name: find_jobs_by_id
-- (By the primary key: a page reads as far as its last job, not every match.)
SELECT job_id, shard, type, payload, state, run_at, created_at, attempt, max_attempts, fence,
       lease_owner, lease_until, started_at, finished_at, idempotency_key, last_error, history,
       result, result_encoding, deadline, priority, unstarted, start_noticed, 0
FROM jobs WHERE ({jobs_matching}) AND job_id > :after_id
ORDER BY job_id LIMIT :limit;

-- name: count_jobs
SELECT count(*) FROM jobs WHERE {jobs_matching};

-- name: select_shard
SELECT shard, epoch, owner, cursor FROM shards WHERE shard = ?;

-- name: insert_shard
INSERT OR IGNORE INTO shards (shard, epoch, owner, cursor) VALUES (?, ?, ?, ?);

-- name: bump_epoch
UPDATE shards SET epoch = epoch + 1, owner = ? WHERE shard = ? AND epoch = ?;

-- name: save_cursor
UPDATE shards SET cursor = ? WHERE shard = ? AND epoch = ?;

-- name: select_meta
SELECT value FROM meta WHERE key = ?;

-- name: insert_meta
INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?);

-- name: upsert_meta
INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?);

-- name: select_all_meta
SELECT key, value FROM meta;

-- name: insert_audit
INSERT OR REPLACE INTO audit (at, id, entry) VALUES (?, ?, ?);

-- name: expire_audit
-- The actions past their retention go as a new one is written (a few a day: no sweep needed).
DELETE FROM audit WHERE at < ?;

-- name: select_audit
SELECT entry FROM audit WHERE at >= ? ORDER BY at DESC, id LIMIT ?;

-- name: delete_job
DELETE FROM jobs WHERE job_id = ?;

-- name: select_schedule
-- Also a deleted one (``deleted``): the store reads it as none.
SELECT * FROM schedules WHERE schedule_id = ?;

-- name: insert_schedule
INSERT OR IGNORE INTO schedules (schedule_id, shard, cron, timezone, dst_gap, dst_fold, type,
    payload, max_attempts, misfire, misfire_grace_ms, max_catchup, overlap, max_concurrent,
    jitter_ms, paused, next_fire, created_at, version, active, queued_at, skipped, last_skip_at,
    last_fire_at, spread_ms, revision)
VALUES (:schedule_id, :shard, :cron, :timezone, :dst_gap, :dst_fold, :type, :payload,
    :max_attempts, :misfire, :misfire_grace_ms, :max_catchup, :overlap, :max_concurrent,
    :jitter_ms, :paused, :next_fire, :created_at, :version, :active, :queued_at, :skipped,
    :last_skip_at, :last_fire_at, :spread_ms, :revision);

-- name: revise_schedule
-- A person's change (or a create on a deleted schedule's id): every column, the revision, and
-- whether it is deleted; conditional on the version, as update_schedule, and on being live
-- (or deleted, for a create on its id).
UPDATE schedules SET shard = :shard, cron = :cron, timezone = :timezone, dst_gap = :dst_gap,
    dst_fold = :dst_fold, type = :type, payload = :payload, max_attempts = :max_attempts,
    misfire = :misfire, misfire_grace_ms = :misfire_grace_ms, max_catchup = :max_catchup,
    overlap = :overlap, max_concurrent = :max_concurrent, jitter_ms = :jitter_ms,
    paused = :paused, next_fire = :next_fire, created_at = :created_at, version = :version + 1,
    active = :active, queued_at = :queued_at, skipped = :skipped, last_skip_at = :last_skip_at,
    last_fire_at = :last_fire_at, spread_ms = :spread_ms, revision = :revision,
    deleted = :deleted
WHERE schedule_id = :schedule_id AND version = :version AND deleted = :was_deleted;

-- name: insert_revision
INSERT OR REPLACE INTO schedule_revisions (schedule_id, revision, record) VALUES (?, ?, ?);

-- name: trim_revisions
-- The revisions of a schedule older than the newest REVISIONS_KEPT.
DELETE FROM schedule_revisions WHERE schedule_id = ? AND revision <= ?;

-- name: select_revisions
-- A page of a schedule's history: the revisions below a number, newest first.
SELECT record FROM schedule_revisions WHERE schedule_id = ? AND revision < ?
ORDER BY revision DESC LIMIT ?;

-- name: purge_schedule
-- A deleted schedule's row, once past the ledger retention (store.purge_schedule), as read.
DELETE FROM schedules WHERE schedule_id = ? AND version = ? AND deleted = 1;

-- name: purge_revisions
DELETE FROM schedule_revisions WHERE schedule_id = ?;

-- name: select_revision
SELECT record FROM schedule_revisions WHERE schedule_id = ? AND revision = ?;

-- name: update_schedule
UPDATE schedules SET cron = :cron, timezone = :timezone, dst_gap = :dst_gap,
    dst_fold = :dst_fold, type = :type, payload = :payload, max_attempts = :max_attempts,
    misfire = :misfire, misfire_grace_ms = :misfire_grace_ms, max_catchup = :max_catchup,
    overlap = :overlap, max_concurrent = :max_concurrent, jitter_ms = :jitter_ms,
    paused = :paused, next_fire = :next_fire, version = :version + 1, active = :active,
    queued_at = :queued_at, skipped = :skipped, last_skip_at = :last_skip_at,
    last_fire_at = :last_fire_at, spread_ms = :spread_ms
WHERE schedule_id = :schedule_id AND version = :version;

-- name: list_schedules
SELECT * FROM schedules WHERE schedule_id > ? AND deleted = 0 ORDER BY schedule_id LIMIT ?;

-- name: put_ledger
-- The occurrence ledger (timeshard.ledger): a row per decided occurrence, or run of them,
-- as JSON text; a later decision for the same nominal time replaces it.
INSERT OR REPLACE INTO schedule_ledger (schedule_id, nominal, expires_at, row) VALUES (?, ?, ?, ?);

-- name: read_ledger
SELECT row FROM schedule_ledger WHERE schedule_id = ? AND nominal <= ?
ORDER BY nominal DESC LIMIT ?;

-- name: sweep_ledger
DELETE FROM schedule_ledger WHERE (schedule_id, nominal) IN (
    SELECT schedule_id, nominal FROM schedule_ledger WHERE expires_at <= ? LIMIT ?);

-- name: sweep_scan
-- Retention: the next rows in table order, a bounded slice per sweep (no index needed; a
-- full pass over a million jobs takes about half an hour of sweeps).
SELECT rowid, job_id, state, finished_at, idempotency_key FROM jobs
WHERE rowid > ? ORDER BY rowid LIMIT ?;

-- name: sweep_delete
DELETE FROM jobs WHERE rowid = ? AND finished_at = ? AND state = ?;

-- name: sweep_key
DELETE FROM idempotency_keys WHERE key = ? AND job_id = ?;
