-- 003_publication.sql: the publication cdc-relay subscribes to.
--
-- It covers only public.outbox_events and only INSERTs, so the WAL decoder sends the relay
-- nothing about other tables and nothing about UPDATE/DELETE/TRUNCATE of the outbox.
--
-- Who runs it: creating a publication FOR TABLE needs ownership of the table (or superuser),
-- so run this as the owner of public.outbox_events (the role that ran 001), not as the
-- relay's role. The relay, running as the least-privilege role of 004_role.sql, is then
-- started with --create-publication=false and only checks that the publication exists and
-- still covers the table (if it does not, the relay stops and says so).
--
-- Server settings the relay needs (postgresql.conf, restart required):
--   wal_level = logical
--   max_replication_slots >= 1 per relay (plus any other consumers)
--   max_wal_senders       >= 1 per relay (plus any other consumers)
--
-- Safe to run more than once: creates the publication when it is missing, and adds the
-- table back when the publication exists without it. It does not change the publish
-- option of an existing publication; check it with
--   SELECT pubname, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'cdc_relay_outbox') THEN
        CREATE PUBLICATION cdc_relay_outbox FOR TABLE public.outbox_events WITH (publish = 'insert');
        RAISE NOTICE 'created publication cdc_relay_outbox';
    ELSIF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_publication_tables
        WHERE pubname = 'cdc_relay_outbox' AND schemaname = 'public' AND tablename = 'outbox_events'
    ) THEN
        ALTER PUBLICATION cdc_relay_outbox ADD TABLE public.outbox_events;
        RAISE NOTICE 'added public.outbox_events to existing publication cdc_relay_outbox';
    END IF;
END
$$;
