-- 004_role.sql: a least-privilege login role for cdc-relay.
--
-- Run with psql, connected to the database that holds the outbox, after 001-003, as a
-- superuser or, where there is none (managed services), as the provider's admin role
-- (CREATEROLE, not a superuser): see "Managed services" below.
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
-- Managed services: the file only changes the attributes that differ from the ones below,
-- so the provider's admin role (CREATEROLE, not a superuser) can run it: a new role has
-- them all but LOGIN and REPLICATION. REPLICATION itself is what a superuser gives; so
-- does, from PostgreSQL 16, a CREATEROLE role that has REPLICATION (Supabase's postgres),
-- and so do Azure's and Cloud SQL's admin users. Where the provider has a replication role
-- instead (Amazon RDS/Aurora: rds_replication, with rds.logical_replication = 1), name it
-- and the file grants it rather than the attribute:
--
--   psql -v ON_ERROR_STOP=1 -v cdc_relay_replication_role=rds_replication \
--        -v cdc_relay_password='<choose-a-secret>' -d <db> -f 004_role.sql
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

\if :{?cdc_relay_replication_role}
SET cdc_relay.replication_role = :'cdc_relay_replication_role';
\endif

-- Exactly the attributes the relay needs, and no others: LOGIN, REPLICATION (or the
-- provider's replication role), NOSUPERUSER, NOCREATEDB, NOCREATEROLE, NOBYPASSRLS.
-- Only those that differ are altered: changing SUPERUSER (even to NOSUPERUSER), and
-- before PostgreSQL 16 REPLICATION, needs a superuser.
DO $$
DECLARE
    r pg_catalog.pg_roles%ROWTYPE;
    replication_role text := nullif(current_setting('cdc_relay.replication_role', true), '');
    change text := '';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_relay') THEN
        CREATE ROLE cdc_relay;
        RAISE NOTICE 'created role cdc_relay';
    END IF;
    SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = 'cdc_relay';
    IF NOT r.rolcanlogin THEN change := change || ' LOGIN'; END IF;
    IF replication_role IS NULL AND NOT r.rolreplication THEN change := change || ' REPLICATION'; END IF;
    IF r.rolsuper THEN change := change || ' NOSUPERUSER'; END IF;
    IF r.rolcreatedb THEN change := change || ' NOCREATEDB'; END IF;
    IF r.rolcreaterole THEN change := change || ' NOCREATEROLE'; END IF;
    IF r.rolbypassrls THEN change := change || ' NOBYPASSRLS'; END IF;
    IF change <> '' THEN
        BEGIN
            EXECUTE 'ALTER ROLE cdc_relay WITH' || change;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'cannot ALTER ROLE cdc_relay WITH% as role %: %', change, current_user, SQLERRM
                USING HINT = 'run 004_role.sql as a superuser; where there is none, as the provider''s admin role, '
                    'with -v cdc_relay_replication_role=<the provider''s replication role> (rds_replication on Amazon RDS and Aurora) '
                    'when it may not give REPLICATION (before PostgreSQL 16 only a superuser may)';
        END;
    END IF;
    IF replication_role IS NOT NULL AND NOT pg_catalog.pg_has_role('cdc_relay', replication_role, 'MEMBER') THEN
        EXECUTE format('GRANT %I TO cdc_relay', replication_role);
    END IF;
END
$$;

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
