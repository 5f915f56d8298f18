-- 006_consumer.sql: the tables of the idempotent consumer (the Go package
-- github.com/cdc-relay/cdc-relay/consumer), in the CONSUMER's database.
--
-- Apply this to the database the consuming service writes its business data to — not
-- the outbox database, unless producer and consumer share one (as in the docker-compose
-- demo, which runs every file here on its single database). Run it as a role that may
-- create tables; the consumer's role then needs
--   GRANT SELECT, INSERT, UPDATE, DELETE ON public.processed_messages TO <role>;
--   GRANT SELECT, INSERT, UPDATE ON public.consumer_dead_letters TO <role>;
--   GRANT USAGE ON SEQUENCE public.consumer_dead_letters_id_seq TO <role>;
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
-- failure, correlation id, schema version) and to run them again after the fix
-- (consumer.Reprocess, which sets status to 'reprocessed'). List them with
--   SELECT id, message_id, error_code, retry_count, last_failed_at, left(error_message, 80)
--   FROM public.consumer_dead_letters WHERE consumer_name = '<name>' AND status = 'dead'
--   ORDER BY last_failed_at;
--
-- Safe to run more than once (IF NOT EXISTS).

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
    status             text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'reprocessed')),
    reprocess_attempts int         NOT NULL DEFAULT 0,
    reprocessed_at     timestamptz,
    reprocessed_by     text,
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS "consumer_dead_letters_status_idx" ON "public"."consumer_dead_letters" (consumer_name, status, last_failed_at);

COMMENT ON TABLE public.processed_messages IS
    'Idempotent consumer claims: (consumer_name, message_id) of every message that took effect or was dead-lettered; written in the business transaction, before the Kafka offset commit.';
COMMENT ON COLUMN public.processed_messages.message_id IS
    'The Kafka header "id" (the outbox event id); ids over 255 bytes as sha256:<hex>; records without one as no-id:<topic>:<partition>:<offset>.';
COMMENT ON TABLE public.consumer_dead_letters IS
    'Idempotent consumer dead letters: messages isolated after a permanent failure or the retry budget; reprocess them with consumer.Reprocess after the fix.';
COMMENT ON COLUMN public.consumer_dead_letters.retry_count IS
    'Handler attempts after the first (0: failed permanently at once).';
COMMENT ON COLUMN public.consumer_dead_letters.status IS
    'dead: isolated, redeliveries skipped; reprocessed: consumer.Reprocess ran the handler and committed.';
