-- 005_dead_letters.sql: the dead-letter store of cdc-relay's dlq failure policy, the
-- history of replays, and the letters' state transitions.
--
-- When an event fails permanently (message too large for the broker, a topic name Kafka
-- refuses, an empty aggregate_id), the relay with the dlq policy (the default) stores it
-- here, with why and when, and goes on; it confirms the WAL past the event only once the
-- row is committed. Operators then use the CLI:
--   cdc-relay dlq list | show ID | replay | purge | history
--   cdc-relay replay --since 2h     (republish rows still in the outbox table)
-- A replayed message keeps its "id" header (consumers drop repeats by it) and carries the
-- header cdc_relay_replay = the id of the replay in cdc_relay_dead_letters_replays.
--
-- A letter's status follows the reprocessing model pending -> processing -> completed,
-- retry_wait after a failed attempt, dead once the automatic retries (run
-- --dlq-auto-retry) spent their budget. A replay claims the letters it publishes with a
-- lease (claimed_by, claimed_until, renewed while it publishes; another replay takes the
-- letters over once it expired); cdc_relay_dead_letters_transitions records every change.
--
-- The relay creates these tables itself when its role may (this text is what it runs, see
-- deadletter.TableDDL). For a least-privilege role (004_role.sql), run this file as the
-- schema owner instead: after 004, so the GRANTs below reach cdc_relay (run it again after
-- 004 otherwise). For another table name (--dlq-table), replace cdc_relay_dead_letters
-- throughout.
--
-- Safe to run more than once (IF NOT EXISTS; GRANTs are idempotent). Run it again on
-- tables made by an older version: it adds the state model's columns and table, and
-- marks 'replayed' letters 'completed' (the relay does this itself when its role owns
-- the tables).

-- The IF NOT EXISTS below make a second run print "already exists, skipping" NOTICEs;
-- they say nothing to act on, so this session shows warnings and errors only.
SET client_min_messages = warning;

CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters" (
    id                 bigserial   PRIMARY KEY,
    event_id           text        NOT NULL UNIQUE,
    aggregate_type     text,
    aggregate_id       text,
    event_type         text,
    message_key        bytea,
    payload            bytea       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}',
    topic              text        NOT NULL,
    error_code         text        NOT NULL,
    error_message      text        NOT NULL,
    retry_count        int         NOT NULL DEFAULT 0,
    first_failed_at    timestamptz NOT NULL,
    last_failed_at     timestamptz NOT NULL,
    relay_name         text        NOT NULL DEFAULT '',
    correlation_id     text,
    schema_version     text,
    commit_lsn         pg_lsn,
    source_table       text,
    status             text        NOT NULL DEFAULT 'pending' CONSTRAINT "cdc_relay_dead_letters_state_check" CHECK (status IN ('pending', 'processing', 'retry_wait', 'completed', 'dead', 'replayed')),
    replayed_at        timestamptz,
    replay_count       int         NOT NULL DEFAULT 0,
    attempts           int         NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz,
    last_attempt_at    timestamptz,
    last_attempt_error text,
    claimed_by         text,
    claimed_until      timestamptz
);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_status_idx" ON "public"."cdc_relay_dead_letters" (status, last_failed_at);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_error_code_idx" ON "public"."cdc_relay_dead_letters" (error_code);
CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters_replays" (
    id             bigserial   PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('dlq', 'outbox')),
    actor          text        NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    filters        jsonb       NOT NULL DEFAULT '{}',
    dry_run        boolean     NOT NULL DEFAULT false,
    forced         boolean     NOT NULL DEFAULT false,
    rate_per_sec   float8      NOT NULL DEFAULT 0,
    selected       int         NOT NULL DEFAULT 0,
    published      int         NOT NULL DEFAULT 0,
    skipped        int         NOT NULL DEFAULT 0,
    failed         int         NOT NULL DEFAULT 0,
    topic_override text
);
CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters_replay_events" (
    id             bigserial   PRIMARY KEY,
    replay_id      bigint      NOT NULL REFERENCES "public"."cdc_relay_dead_letters_replays" (id) ON DELETE CASCADE,
    event_id       text        NOT NULL,
    dead_letter_id bigint,
    result         text        NOT NULL CHECK (result IN ('published', 'skipped', 'failed', 'dry_run')),
    error          text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_replay_events_replay_idx" ON "public"."cdc_relay_dead_letters_replay_events" (replay_id);
CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters_transitions" (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    event_id       text        NOT NULL,
    replay_id      bigint      REFERENCES "public"."cdc_relay_dead_letters_replays" (id) ON DELETE CASCADE,
    owner          text        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    attempt        int         NOT NULL DEFAULT 0,
    topic          text,
    detail         text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_transitions_letter_idx" ON "public"."cdc_relay_dead_letters_transitions" (dead_letter_id);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_transitions_replay_idx" ON "public"."cdc_relay_dead_letters_transitions" (replay_id);
-- Tables of versions before the state model: add its columns, allow its
-- statuses, and call 'replayed' letters 'completed'.
ALTER TABLE "public"."cdc_relay_dead_letters"
    ADD COLUMN IF NOT EXISTS attempts           int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS next_attempt_at    timestamptz,
    ADD COLUMN IF NOT EXISTS last_attempt_at    timestamptz,
    ADD COLUMN IF NOT EXISTS last_attempt_error text,
    ADD COLUMN IF NOT EXISTS claimed_by         text,
    ADD COLUMN IF NOT EXISTS claimed_until      timestamptz;
ALTER TABLE "public"."cdc_relay_dead_letters_replays" ADD COLUMN IF NOT EXISTS topic_override text;
ALTER TABLE "public"."cdc_relay_dead_letters" ADD COLUMN IF NOT EXISTS source_table text;
DO $cdc_relay$
DECLARE
    old name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
            WHERE conrelid = '"public"."cdc_relay_dead_letters"'::regclass AND conname = 'cdc_relay_dead_letters_state_check'::name) THEN
        FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                WHERE c.conrelid = '"public"."cdc_relay_dead_letters"'::regclass AND c.contype = 'c' AND a.attname = 'status' LOOP
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '"public"."cdc_relay_dead_letters"', old);
        END LOOP;
        UPDATE "public"."cdc_relay_dead_letters" SET status = 'completed' WHERE status = 'replayed';
        ALTER TABLE "public"."cdc_relay_dead_letters" ADD CONSTRAINT "cdc_relay_dead_letters_state_check" CHECK (status IN ('pending', 'processing', 'retry_wait', 'completed', 'dead', 'replayed'));
    END IF;
END
$cdc_relay$;

-- What follows says something worth reading (a missing role).
RESET client_min_messages;

-- cdc_relay stores dead letters (INSERT ... ON CONFLICT (event_id) DO UPDATE) and reads the
-- backlog; with --dlq-auto-retry it claims, marks and records transitions; the dlq
-- commands, when run with the relay's credentials, also mark, purge and record replays. "cdc-relay prune" deletes from the outbox, which cdc_relay may not: run
-- it as the outbox owner.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_relay') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.cdc_relay_dead_letters TO cdc_relay;
        GRANT SELECT, INSERT, UPDATE ON public.cdc_relay_dead_letters_replays TO cdc_relay;
        GRANT SELECT, INSERT ON public.cdc_relay_dead_letters_replay_events TO cdc_relay;
        GRANT SELECT, INSERT ON public.cdc_relay_dead_letters_transitions TO cdc_relay;
        GRANT USAGE ON SEQUENCE public.cdc_relay_dead_letters_id_seq,
            public.cdc_relay_dead_letters_replays_id_seq,
            public.cdc_relay_dead_letters_replay_events_id_seq,
            public.cdc_relay_dead_letters_transitions_id_seq TO cdc_relay;
    ELSE
        RAISE NOTICE 'role cdc_relay does not exist (yet): run 004_role.sql, then this file again for its grants';
    END IF;
END
$$;

COMMENT ON TABLE public.cdc_relay_dead_letters IS
    'cdc-relay dead letters: outbox events that failed permanently, with the error; list, replay and purge them with "cdc-relay dlq".';
COMMENT ON COLUMN public.cdc_relay_dead_letters.event_id IS
    'The outbox event id (Kafka header "id"); one row per event, later failures update it (retry_count, last_failed_at).';
COMMENT ON COLUMN public.cdc_relay_dead_letters.topic IS
    'The topic the event was meant for; a replay publishes there.';
COMMENT ON COLUMN public.cdc_relay_dead_letters.headers IS
    'Every Kafka header of the message, as a JSON object of strings.';
COMMENT ON COLUMN public.cdc_relay_dead_letters.status IS
    'pending (stored, not attempted), processing (claimed by claimed_by until claimed_until), retry_wait (an attempt failed; due at next_attempt_at), completed (published and acknowledged; replayed in older versions), dead (the automatic retries gave up). Back to pending if the event fails again in the relay.';
COMMENT ON COLUMN public.cdc_relay_dead_letters.claimed_by IS
    'The replay holding the letter while processing; once claimed_until passed, another replay may take it over.';
COMMENT ON COLUMN public.cdc_relay_dead_letters.attempts IS
    'Replay attempts (by hand or automatic) since the relay stored the letter; the automatic retries'' budget counts them.';
COMMENT ON TABLE public.cdc_relay_dead_letters_replays IS
    'cdc-relay replay history: who replayed what (filters), when, and the totals.';
COMMENT ON TABLE public.cdc_relay_dead_letters_replay_events IS
    'cdc-relay replay history: the result of every event of every replay.';
COMMENT ON TABLE public.cdc_relay_dead_letters_transitions IS
    'cdc-relay dead-letter history: every status change of a letter (claimed, completed, retry_wait, dead, released), who made it, and topic overrides.';
