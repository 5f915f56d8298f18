-- The migration of cdc-relay versions before the reprocessing state model, kept to test
-- that the store upgrades the tables it made (TestUpgradeFromV1).

-- 005_dead_letters.sql: the dead-letter store of cdc-relay's dlq failure policy, and the
-- history of replays.
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
-- The relay creates these tables itself when its role may (this text is what it runs, see
-- deadletter.TableDDL). For a least-privilege role (004_role.sql), run this file as the
-- schema owner instead: after 004, so the GRANTs below reach cdc_relay (run it again after
-- 004 otherwise). For another table name (--dlq-table), replace cdc_relay_dead_letters
-- throughout.
--
-- Safe to run more than once (IF NOT EXISTS; GRANTs are idempotent).

CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters" (
    id              bigserial   PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE,
    aggregate_type  text,
    aggregate_id    text,
    event_type      text,
    message_key     bytea,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    topic           text        NOT NULL,
    error_code      text        NOT NULL,
    error_message   text        NOT NULL,
    retry_count     int         NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    relay_name      text        NOT NULL DEFAULT '',
    correlation_id  text,
    schema_version  text,
    commit_lsn      pg_lsn,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed')),
    replayed_at     timestamptz,
    replay_count    int         NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_status_idx" ON "public"."cdc_relay_dead_letters" (status, last_failed_at);
CREATE INDEX IF NOT EXISTS "cdc_relay_dead_letters_error_code_idx" ON "public"."cdc_relay_dead_letters" (error_code);
CREATE TABLE IF NOT EXISTS "public"."cdc_relay_dead_letters_replays" (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('dlq', 'outbox')),
    actor        text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    filters      jsonb       NOT NULL DEFAULT '{}',
    dry_run      boolean     NOT NULL DEFAULT false,
    forced       boolean     NOT NULL DEFAULT false,
    rate_per_sec float8      NOT NULL DEFAULT 0,
    selected     int         NOT NULL DEFAULT 0,
    published    int         NOT NULL DEFAULT 0,
    skipped      int         NOT NULL DEFAULT 0,
    failed       int         NOT NULL DEFAULT 0
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

-- cdc_relay stores dead letters (INSERT ... ON CONFLICT (event_id) DO UPDATE) and reads the
-- backlog; the dlq commands, when run with the relay's credentials, also mark, purge and
-- record replays. "cdc-relay prune" deletes from the outbox, which cdc_relay may not: run
-- it as the outbox owner.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_relay') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.cdc_relay_dead_letters TO cdc_relay;
        GRANT SELECT, INSERT, UPDATE ON public.cdc_relay_dead_letters_replays TO cdc_relay;
        GRANT SELECT, INSERT ON public.cdc_relay_dead_letters_replay_events TO cdc_relay;
        GRANT USAGE ON SEQUENCE public.cdc_relay_dead_letters_id_seq,
            public.cdc_relay_dead_letters_replays_id_seq,
            public.cdc_relay_dead_letters_replay_events_id_seq TO cdc_relay;
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
    'pending until a replay is acknowledged by Kafka, then replayed (back to pending if the event fails again).';
COMMENT ON TABLE public.cdc_relay_dead_letters_replays IS
    'cdc-relay replay history: who replayed what (filters), when, and the totals.';
COMMENT ON TABLE public.cdc_relay_dead_letters_replay_events IS
    'cdc-relay replay history: the result of every event of every replay.';
