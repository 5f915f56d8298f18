-- 004_role.sql: a least-privilege login role for cdc-relay.
--
-- Run with psql, as a superuser (in PostgreSQL 15 only a superuser may give a role the
-- REPLICATION attribute), connected to the database that holds the outbox, after 001-003.
-- Set the password with a psql variable so it never lands in this file or in the shell
-- history of a SQL script:
--
--   psql -v ON_ERROR_STOP=1 -v cdc_relay_password='<choose-a-secret>' -d <db> -f 004_role.sql
--
-- Without -v cdc_relay_password the role is created (or updated) with its password left as
-- it was (none for a new role, so it cannot log in with a password yet); set it later with
-- psql's \password cdc_relay, which sends it already hashed.
--
-- What the relay is granted, and why
--   LOGIN, REPLICATION     open a logical replication connection (replication=database),
--                          create and stream its replication slot (pgoutput)
--   CONNECT on the db      connect at all (explicit, for databases that revoked it from PUBLIC)
--   USAGE on schema public reach the two tables below
--   SELECT outbox_events   start-up checks and replay
--   SELECT, INSERT, UPDATE cdc_relay_checkpoints: read and upsert its checkpoint
--                          (INSERT ... ON CONFLICT (slot_name) DO UPDATE)
-- PostgreSQL 13 and 14 let every role create tables in schema public; revoke that once
-- (REVOKE CREATE ON SCHEMA public FROM PUBLIC;, the default from 15) or cdc_relay can too.
-- It is not granted ownership of the outbox, so it cannot create or alter the publication:
-- 003_publication.sql creates it as the table owner, and the relay runs with
-- --create-publication=false. It can neither write to nor delete from the outbox.
--
-- Managed services: where no superuser is available, use the provider's replication grant
-- instead of the REPLICATION attribute (for example on Amazon RDS/Aurora:
-- GRANT rds_replication TO cdc_relay; with rds.logical_replication = 1).
--
-- pg_hba.conf: the relay connects to the outbox database twice, once as a normal session
-- and once as a logical replication session (replication=database). BOTH are matched by an
-- ordinary line that names the database (or "all"), for example
--
--   # TYPE   DATABASE  USER       ADDRESS       METHOD
--   hostssl  appdb     cdc_relay  10.0.0.0/8    scram-sha-256
--
-- The "replication" keyword in the DATABASE column matches only PHYSICAL replication
-- connections (pg_basebackup, streaming standbys); it does not match logical replication
-- connections, so a "replication" line alone is neither needed nor sufficient for the relay.
-- Reload after editing: SELECT pg_reload_conf();
--
-- Safe to run more than once: creates the role when it is missing, otherwise brings its
-- attributes back to the ones below; GRANTs are idempotent.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_relay') THEN
        CREATE ROLE cdc_relay;
        RAISE NOTICE 'created role cdc_relay';
    END IF;
END
$$;

-- Exactly the attributes the relay needs, and no others.
ALTER ROLE cdc_relay WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;

\if :{?cdc_relay_password}
ALTER ROLE cdc_relay WITH PASSWORD :'cdc_relay_password';
\else
\echo '004_role.sql: cdc_relay_password not set, the password of role cdc_relay is unchanged (set it with \\password cdc_relay)'
\endif

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO cdc_relay', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO cdc_relay;
GRANT SELECT ON public.outbox_events TO cdc_relay;
GRANT SELECT, INSERT, UPDATE ON public.cdc_relay_checkpoints TO cdc_relay;
