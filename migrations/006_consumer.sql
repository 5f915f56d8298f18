-- 006_consumer.sql: the tables of the idempotent consumer (the Go package
-- github.com/cdc-relay/cdc-relay/consumer), in the CONSUMER's database.
--
-- Apply this to the database the consuming service writes its business data to — not
-- the outbox database, unless producer and consumer share one (as in the docker-compose
-- demo, which runs every file here on its single database). Run it as a role that may
-- create tables; the consumer's role then needs
--   GRANT SELECT, INSERT, UPDATE, DELETE ON public.processed_messages TO <role>;
--   GRANT SELECT, INSERT, UPDATE ON public.consumer_dead_letters TO <role>;
--   GRANT SELECT, INSERT ON public.consumer_dead_letters_transitions TO <role>;
--   GRANT USAGE ON SEQUENCE public.consumer_dead_letters_id_seq,
--       public.consumer_dead_letters_transitions_id_seq TO <role>;
-- (DELETE on processed_messages only for consumer.Prune). consumer.Migrate runs this same
-- text (consumer.DDL) when the consumer's role may create tables itself. For another
-- dead-letter table name (consumer.Config.DeadLetterTable), replace consumer_dead_letters
-- throughout.
--
-- processed_messages: one row per (consumer, message id) that took effect — or was
-- dead-lettered, so that a redelivery of an isolated message is skipped too. The consumer
-- inserts the row with ON CONFLICT DO NOTHING in the same transaction as the business
-- change, commits, and only then commits the Kafka offset: a redelivered message finds its
-- row and is skipped. Deleting a row lets the message take effect again if it is delivered
-- again: prune (consumer.Prune) only rows older than the broker's retention of the topics
-- plus the longest replay anyone may run, and never for effects that must not repeat
-- (money). See the README, "The consumer half: idempotent consumers".
--
-- consumer_dead_letters: messages that failed permanently or used up the retry budget,
-- with the metadata to find the cause (error code and message, retry count, first and last
-- failure, correlation id, schema version) and to run them again after the fix. Their
-- status follows the state model of the relay's dead letters (005_dead_letters.sql):
-- pending -> processing -> completed, retry_wait after a failed reprocessing attempt, dead
-- once the budget is spent (a permanent failure at once). A reprocessor (consumer.Reprocess,
-- consumer.ReprocessDue, Config.AutoReprocess) claims a letter with a lease (claimed_by,
-- claimed_until); another takes it over once the lease expired.
-- consumer_dead_letters_transitions records every change of status, who made it and why.
-- List them with
--   SELECT id, message_id, status, error_code, retry_count, reprocess_attempts, last_failed_at,
--          left(coalesce(last_attempt_error, error_message), 80)
--   FROM public.consumer_dead_letters WHERE consumer_name = '<name>' AND status <> 'completed'
--   ORDER BY last_failed_at;
--
-- Safe to run more than once (IF NOT EXISTS). Run it again on tables made by an older
-- version: it adds the state model's columns and history table, replaces the status
-- CHECK, and marks 'reprocessed' letters 'completed' (consumer.Migrate does this too).

-- The IF NOT EXISTS below make a second run print "already exists, skipping" NOTICEs;
-- they say nothing to act on, so this session shows warnings and errors only.
SET client_min_messages = warning;

CREATE TABLE IF NOT EXISTS "public"."processed_messages" (
    consumer_name text        NOT NULL,
    message_id    text        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS "processed_messages_processed_at_idx" ON "public"."processed_messages" (processed_at);
CREATE TABLE IF NOT EXISTS "public"."consumer_dead_letters" (
    id                 bigserial   PRIMARY KEY,
    consumer_name      text        NOT NULL,
    message_id         text        NOT NULL,
    topic              text        NOT NULL,
    kafka_partition    int         NOT NULL,
    kafka_offset       bigint      NOT NULL,
    message_key        bytea,
    payload            bytea,
    headers            jsonb       NOT NULL DEFAULT '{}',
    message_time       timestamptz,
    error_code         text        NOT NULL,
    error_message      text        NOT NULL,
    retry_count        int         NOT NULL DEFAULT 0,
    first_failed_at    timestamptz NOT NULL,
    last_failed_at     timestamptz NOT NULL,
    correlation_id     text,
    schema_version     text,
    status             text        NOT NULL DEFAULT 'dead' CONSTRAINT "consumer_dead_letters_state_check" CHECK (status IN ('pending', 'processing', 'retry_wait', 'completed', 'dead', 'reprocessed')),
    reprocess_attempts int         NOT NULL DEFAULT 0,
    reprocessed_at     timestamptz,
    reprocessed_by     text,
    next_attempt_at    timestamptz,
    last_attempt_at    timestamptz,
    last_attempt_error text,
    claimed_by         text,
    claimed_until      timestamptz,
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS "consumer_dead_letters_status_idx" ON "public"."consumer_dead_letters" (consumer_name, status, last_failed_at);
CREATE TABLE IF NOT EXISTS "public"."consumer_dead_letters_transitions" (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    consumer_name  text        NOT NULL,
    message_id     text        NOT NULL,
    owner          text        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    attempt        int         NOT NULL DEFAULT 0,
    detail         text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "consumer_dead_letters_transitions_letter_idx" ON "public"."consumer_dead_letters_transitions" (dead_letter_id);
-- Tables of versions before the state model (statuses dead and reprocessed
-- only): add its columns, allow its statuses, call 'reprocessed' letters
-- 'completed'. Skipped, without a lock, once the constraint exists.
DO $cdc_relay$
DECLARE
    old name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
            WHERE conrelid = '"public"."consumer_dead_letters"'::regclass AND conname = 'consumer_dead_letters_state_check'::name) THEN
        ALTER TABLE "public"."consumer_dead_letters"
            ADD COLUMN IF NOT EXISTS next_attempt_at    timestamptz,
            ADD COLUMN IF NOT EXISTS last_attempt_at    timestamptz,
            ADD COLUMN IF NOT EXISTS last_attempt_error text,
            ADD COLUMN IF NOT EXISTS claimed_by         text,
            ADD COLUMN IF NOT EXISTS claimed_until      timestamptz;
        FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                WHERE c.conrelid = '"public"."consumer_dead_letters"'::regclass AND c.contype = 'c' AND a.attname = 'status' LOOP
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '"public"."consumer_dead_letters"', old);
        END LOOP;
        UPDATE "public"."consumer_dead_letters" SET status = 'completed' WHERE status = 'reprocessed';
        ALTER TABLE "public"."consumer_dead_letters" ADD CONSTRAINT "consumer_dead_letters_state_check" CHECK (status IN ('pending', 'processing', 'retry_wait', 'completed', 'dead', 'reprocessed'));
    END IF;
END
$cdc_relay$;

COMMENT ON TABLE public.processed_messages IS
    'Idempotent consumer claims: (consumer_name, message_id) of every message that took effect or was dead-lettered; written in the business transaction, before the Kafka offset commit.';
COMMENT ON COLUMN public.processed_messages.message_id IS
    'The Kafka header "id" (the outbox event id); ids over 255 bytes as sha256:<hex>; records without one as no-id:<topic>:<partition>:<offset>.';
COMMENT ON TABLE public.consumer_dead_letters IS
    'Idempotent consumer dead letters: messages isolated after a permanent failure or the retry budget; reprocessed automatically (Config.AutoReprocess) or with consumer.Reprocess after the fix.';
COMMENT ON COLUMN public.consumer_dead_letters.retry_count IS
    'Handler attempts after the first (0: failed permanently at once).';
COMMENT ON COLUMN public.consumer_dead_letters.status IS
    'pending (stored, reprocessed automatically when due), processing (claimed by claimed_by until claimed_until), retry_wait (a reprocessing attempt failed; due at next_attempt_at), completed (reprocessed and committed; reprocessed in older versions), dead (permanent, or the budget spent; only an operator reprocesses it). Redeliveries of the message are skipped whatever the status.';
COMMENT ON COLUMN public.consumer_dead_letters.claimed_by IS
    'The reprocessor holding the letter while processing; once claimed_until passed, another may take it over.';
COMMENT ON TABLE public.consumer_dead_letters_transitions IS
    'Idempotent consumer dead-letter history: every status change (claimed, completed, retry_wait, dead, released), the reprocessor that made it, and the error.';
