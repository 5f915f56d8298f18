-- 002_checkpoints.sql: where cdc-relay stores its checkpoint (the default checkpoint store).
--
-- One row per replication slot. The relay writes the LSN up to which every event has been
-- acknowledged by Kafka (acks=all), together with the server's system identifier, so that
-- on start it can compare the stored position with pg_replication_slots and refuse to
-- skip silently when the slot was dropped, recreated, or moved (for instance after a
-- failover or a restore onto another server). These writes also serve as a heartbeat.
--
-- The relay only SELECTs, INSERTs and UPDATEs here (see 004_role.sql). Deleting a row makes
-- the relay treat the slot as new on its next start: do that only on purpose, with the
-- slot itself dropped too (SELECT pg_drop_replication_slot('<slot>');).
--
-- Safe to run more than once (IF NOT EXISTS).

-- The IF NOT EXISTS below make a second run print "already exists, skipping" NOTICEs;
-- they say nothing to act on, so this session shows warnings and errors only.
SET client_min_messages = warning;

CREATE TABLE IF NOT EXISTS public.cdc_relay_checkpoints (
    slot_name  text        PRIMARY KEY,
    system_id  text        NOT NULL,
    lsn        pg_lsn      NOT NULL,
    relay_name text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    commit_time timestamptz,
    kafka_offsets jsonb,
    oldest_unrelayed_at timestamptz,
    outbox_tables text[],
    pending_joins jsonb
);

-- Added after the first version of this table: run this file again on an older table.
ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS commit_time timestamptz;
ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS kafka_offsets jsonb;
ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS oldest_unrelayed_at timestamptz;
ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS outbox_tables text[];
ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS pending_joins jsonb;

COMMENT ON TABLE public.cdc_relay_checkpoints IS
    'cdc-relay checkpoints: per replication slot, the LSN up to which all events were acknowledged by Kafka. Written by the relay; do not edit while it runs.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.slot_name IS
    'Logical replication slot the relay streams from.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.system_id IS
    'Server system identifier (IDENTIFY_SYSTEM) when the checkpoint was written; a different value means another cluster (restore, failover).';
COMMENT ON COLUMN public.cdc_relay_checkpoints.lsn IS
    'Confirmed LSN: end of the newest transaction whose events, and all before it, were acknowledged.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.relay_name IS
    'Name of the relay instance that wrote the row (for operators).';
COMMENT ON COLUMN public.cdc_relay_checkpoints.updated_at IS
    'Time of the last write; doubles as a heartbeat.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.commit_time IS
    'Commit time of the transaction lsn ends (no later than any commit after it); --on-slot-loss=backfill republishes outbox rows from it, less --backfill-margin.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.kafka_offsets IS
    'Effectively-once delivery: per Kafka topic, its partition count and per partition the offset after the relay''s last record of an event at or before lsn, e.g. {"orders": {"partitions": 8, "next": {"0": 123}}}. NULL when none are stored (--delivery at-least-once).';
COMMENT ON COLUMN public.cdc_relay_checkpoints.oldest_unrelayed_at IS
    'Commit time of the oldest transaction whose events the relay had read and Kafka had not acknowledged at this write; NULL when none waited. cdc-relay status reports its age while the relay runs.';
COMMENT ON COLUMN public.cdc_relay_checkpoints.outbox_tables IS
    'The tables (schema.table, a partition as its root) the publication covered from lsn on, read or not by the relay: the stream resumed from lsn carries every row committed into them after it. An outbox table the relay reads later that is not named here and that it did not add to the publication itself stops it (table_joined); NULL when unknown (an older relay).';
COMMENT ON COLUMN public.cdc_relay_checkpoints.pending_joins IS
    'Joins in progress, a JSON array: each names outbox tables the relay added to the publication (in the transaction that wrote this) whose rows committed before are still being published, with the snapshot of that transaction, the --join mode and each table''s position in Kafka. A start that finds one publishes what is left before streaming; NULL when none.';
