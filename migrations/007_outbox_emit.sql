-- 007_outbox_emit.sql: the table-less outbox (logical decoding messages).
--
-- public.outbox_emit(...) writes one outbox event into the WAL inside the caller's
-- transaction, with no table: pg_logical_emit_message(true, prefix, <JSON envelope>). A relay
-- started with --messages-prefix outbox (PostgreSQL 14+) publishes it once the transaction
-- commits, and never when it rolls back, exactly as it publishes an outbox row; nothing is
-- written to a table, so there is nothing to vacuum, index or clean up. What such an outbox
-- cannot do (no --snapshot initial, replay or backfill: the events exist only in the WAL):
-- docs/message-outbox.md.
--
--   BEGIN;
--   UPDATE orders SET status = 'placed' WHERE id = 42;
--   SELECT outbox_emit('order', '42', 'OrderPlaced', '{"total": 10}');
--   COMMIT;
--
-- The envelope is the JSON object the relay reads: id, aggregate_type, aggregate_id,
-- event_type, payload (any JSON value, published as its JSON text) and, when given, headers
-- (an object of string values, sent as Kafka headers). The function returns the event's id,
-- a new UUID unless one is given. The prefix must be the relay's --messages-prefix.
--
-- Who runs it: any role that may create functions in schema public (the owner of the
-- database, as 001-003). Every role may call it (functions are executable by PUBLIC), and
-- pg_logical_emit_message needs no privilege. The server needs wal_level = logical, as for
-- the outbox table. Safe to run more than once (CREATE OR REPLACE).

CREATE OR REPLACE FUNCTION public.outbox_emit(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    headers        jsonb DEFAULT NULL,
    id             uuid  DEFAULT gen_random_uuid(),
    prefix         text  DEFAULT 'outbox'
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- The relay would dead-letter such an event (bad_message); refuse it here, in the
    -- writer's transaction, where the mistake can still be fixed.
    IF outbox_emit.aggregate_id IS NULL OR outbox_emit.aggregate_id = '' THEN
        RAISE EXCEPTION 'outbox_emit: aggregate_id is empty: it is the Kafka key';
    END IF;
    IF outbox_emit.id IS NULL OR outbox_emit.prefix IS NULL OR outbox_emit.prefix = '' THEN
        RAISE EXCEPTION 'outbox_emit: id and prefix must be set';
    END IF;
    IF outbox_emit.headers IS NOT NULL AND (jsonb_typeof(outbox_emit.headers) <> 'object'
            OR EXISTS (SELECT 1 FROM jsonb_each(outbox_emit.headers) h WHERE jsonb_typeof(h.value) <> 'string')) THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object of string values, got %', outbox_emit.headers;
    END IF;
    PERFORM pg_logical_emit_message(true, outbox_emit.prefix, (
        jsonb_build_object(
            'id', outbox_emit.id::text,
            'aggregate_type', coalesce(outbox_emit.aggregate_type, ''),
            'aggregate_id', outbox_emit.aggregate_id,
            'event_type', coalesce(outbox_emit.event_type, ''),
            'payload', coalesce(outbox_emit.payload, 'null'::jsonb))
        || CASE WHEN outbox_emit.headers IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('headers', outbox_emit.headers) END
    )::text);
    RETURN outbox_emit.id;
END
$$;

COMMENT ON FUNCTION public.outbox_emit(text, text, text, jsonb, jsonb, uuid, text) IS
    'cdc-relay message outbox: emit one event as a transactional logical decoding message (relay --messages-prefix; docs/message-outbox.md)';
