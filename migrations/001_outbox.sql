-- 001_outbox.sql: the outbox table that applications write to and cdc-relay publishes from.
--
-- How it is used
--   The application INSERTs one row per event in the same transaction as its business
--   change. cdc-relay reads committed INSERTs from the WAL (logical replication,
--   pgoutput) and produces each row to Kafka:
--     key     = aggregate_id        (events of one aggregate keep their commit order)
--     value   = payload             (the jsonb text as stored)
--     headers = id, event_type, aggregate_type, commit LSN and commit time
--   Only INSERTs are published (see 003_publication.sql). UPDATE, DELETE and TRUNCATE of
--   this table publish nothing, so rows may be deleted at any time after insert, even in
--   the same transaction: the WAL keeps the inserted row for the relay.
--
-- Column names are the relay's defaults; if you rename them, configure the relay to match.
-- gen_random_uuid() is built in since PostgreSQL 13 (no pgcrypto needed).
--
-- Safe to run more than once (IF NOT EXISTS). Run as the role that should own the table;
-- that owner (or a superuser) must also run 003_publication.sql.

-- The IF NOT EXISTS below make a second run print "already exists, skipping" NOTICEs;
-- they say nothing to act on, so this session shows warnings and errors only.
SET client_min_messages = warning;

CREATE TABLE IF NOT EXISTS public.outbox_events (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- For replaying or pruning by time, e.g.
--   DELETE FROM public.outbox_events WHERE created_at < now() - interval '7 days';
CREATE INDEX IF NOT EXISTS outbox_events_created_at_idx
    ON public.outbox_events (created_at);

COMMENT ON TABLE public.outbox_events IS
    'Transactional outbox: committed INSERTs are relayed to Kafka by cdc-relay (key = aggregate_id, value = payload). Rows may be deleted any time after commit.';
COMMENT ON COLUMN public.outbox_events.id IS
    'Event id; sent as the Kafka header "id", the downstream idempotency key (delivery is at-least-once).';
COMMENT ON COLUMN public.outbox_events.aggregate_type IS
    'Kind of aggregate (e.g. "order"); Kafka header "aggregate_type", usable in a topic template such as outbox.{aggregate_type}.';
COMMENT ON COLUMN public.outbox_events.aggregate_id IS
    'Aggregate identity; the Kafka message key. Events with the same key keep commit order. Must not be empty.';
COMMENT ON COLUMN public.outbox_events.event_type IS
    'Event name (e.g. "OrderPlaced"); Kafka header "event_type".';
COMMENT ON COLUMN public.outbox_events.payload IS
    'Event body; the Kafka message value, as jsonb text.';
COMMENT ON COLUMN public.outbox_events.created_at IS
    'Insert time; for replay and pruning by time. Not used for ordering (commit order is).';
