#!/usr/bin/env bash
# check-migrations.sh: apply migrations/*.sql to a throwaway PostgreSQL cluster, twice,
# and check that the cdc_relay role can do what the relay needs and nothing more.
#
#   bash deploy/postgres/check-migrations.sh          (or: make check-migrations)
#
# Needs the PostgreSQL server binaries (initdb, pg_ctl, postgres), found as the tests find
# them: $CDC_RELAY_PG_BINDIR, else $PGBIN (this script's older name for it), else
# `pg_config --bindir` if that directory has initdb, else initdb on PATH, else Debian's
# /usr/lib/postgresql/15/bin, else the newest /usr/lib/postgresql/<major>/bin. psql and
# pg_recvlogical come from the same directory, else from PATH. As root, the cluster runs as
# the "postgres" OS user, which must be able to execute the binaries. The cluster
# lives in a temporary directory, listens on 127.0.0.1 on a free port and is stopped and
# deleted on exit, whatever happens.
#
# What it proves
#   * each file runs cleanly twice in a row with ON_ERROR_STOP (idempotency), both
#       - the way the docker-compose demo runs them (one superuser runs 001-004, no password), and
#       - the least-privilege way: a non-superuser owner runs 001-003, a superuser runs 004;
#   * as cdc_relay, with a password, over TCP, through a pg_hba.conf that has an ordinary
#     line for the database and NO "replication" line:
#       - a logical replication connection (replication=database) works: IDENTIFY_SYSTEM,
#         CREATE_REPLICATION_SLOT ... LOGICAL pgoutput, streaming with pg_recvlogical;
#       - pg_create_logical_replication_slot() works on a normal connection;
#       - the publication yields committed outbox INSERTs and nothing for UPDATE/DELETE;
#       - SELECT on outbox_events, upsert into cdc_relay_checkpoints work;
#       - writing the outbox, deleting checkpoints, creating a publication and a physical
#         replication connection are all refused.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MIGRATIONS="$ROOT/migrations"
RELAY_PASSWORD='check-migrations-secret'

step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# Run a server-side binary as the cluster's OS user.
if [[ $EUID -eq 0 ]]; then
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

# The server binaries, in internal/sandbox's order (FindPGBin); sets PGBIN and PGBIN_FROM.
has_server() { [[ -x "$1/initdb" && -x "$1/pg_ctl" && -x "$1/postgres" ]]; }
find_pgbin() {
    local d p
    if [[ -n "${CDC_RELAY_PG_BINDIR:-}" ]]; then
        has_server "$CDC_RELAY_PG_BINDIR" ||
            fail "CDC_RELAY_PG_BINDIR=$CDC_RELAY_PG_BINDIR lacks initdb, pg_ctl or postgres; set it to the directory holding them"
        PGBIN=$CDC_RELAY_PG_BINDIR PGBIN_FROM=CDC_RELAY_PG_BINDIR; return
    fi
    if [[ -n "${PGBIN:-}" ]]; then
        has_server "$PGBIN" || fail "PGBIN=$PGBIN lacks initdb, pg_ctl or postgres"
        PGBIN_FROM=PGBIN; return
    fi
    if command -v pg_config >/dev/null && d=$(pg_config --bindir 2>/dev/null) && has_server "$d"; then
        PGBIN=$d PGBIN_FROM="pg_config --bindir"; return
    fi
    if p=$(command -v initdb); then
        d=$(dirname "$p")
        has_server "$d" || d=$(dirname "$(readlink -f "$p")")
        if has_server "$d"; then PGBIN=$d PGBIN_FROM="initdb on PATH"; return; fi
    fi
    for d in /usr/lib/postgresql/15/bin $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4,4nr); do
        if has_server "$d"; then PGBIN=$d PGBIN_FROM="Debian layout"; return; fi
    done
    fail "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found
  tried: CDC_RELAY_PG_BINDIR, PGBIN (unset); pg_config --bindir; initdb on PATH; /usr/lib/postgresql/<major>/bin
  fix, one of:
    - set CDC_RELAY_PG_BINDIR to the directory holding them, e.g. CDC_RELAY_PG_BINDIR=/usr/lib/postgresql/16/bin
    - install the server so pg_config or PATH finds it: apt-get install postgresql-15 (Debian, Ubuntu),
      brew install postgresql@16 (macOS), dnf install postgresql-server (Fedora, RHEL),
      or put an existing server's bin directory on PATH"
}
find_pgbin
# A client program beside the server binaries, else on PATH.
client() {
    if [[ -x "$PGBIN/$1" ]]; then echo "$PGBIN/$1"
    else command -v "$1" || fail "no $1 in $PGBIN nor on PATH (apt-get install postgresql-client)"; fi
}
PSQL=$(client psql)
PG_RECVLOGICAL=$(client pg_recvlogical)
if ! version=$(cd / && as_pg "$PGBIN/postgres" --version 2>&1); then
    [[ $EUID -ne 0 ]] || version="$version (as OS user postgres: as root the cluster runs as
  postgres, which must be able to read and execute $PGBIN and search every directory above
  it: chmod o+rx them, or unpack the binaries under /opt or /usr/local)"
    fail "cannot run $PGBIN/postgres --version: $version"
fi
echo "postgres: PostgreSQL ${version#postgres (PostgreSQL) } from $PGBIN (found via $PGBIN_FROM); psql: $PSQL"

WORK=$(mktemp -d /tmp/cdc-relay-migcheck.XXXXXX)
chmod 755 "$WORK"
[[ $EUID -eq 0 ]] && chown postgres: "$WORK"
DATA="$WORK/data"

cleanup() {
    if [[ -f "$DATA/postmaster.pid" ]]; then
        as_pg "$PGBIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# A free TCP port on loopback (nothing answers a connect to it).
PORT=
for p in $(shuf -i 20000-60000 -n 50); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then PORT=$p; break; fi
done
[[ -n "$PORT" ]] || fail "no free port found"

step "initdb in $DATA, port $PORT"
as_pg "$PGBIN/initdb" -D "$DATA" -A trust -U postgres --no-instructions >/dev/null

# Local socket: trust (the test's own admin sessions). TCP: only cdc_relay, with a
# password, on an ordinary per-database line. Deliberately no "replication" line.
cat >"$DATA/pg_hba.conf" <<'EOF'
local  all                  all                     trust
host   relaydb,composedb    cdc_relay  127.0.0.1/32  scram-sha-256
EOF

as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w start -o \
    "-c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10 \
     -c port=$PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$WORK" >/dev/null \
    || { cat "$WORK/server.log" >&2; fail "server did not start"; }

# Admin sessions over the socket; cdc_relay sessions over TCP with its password.
psql_as() { # user db [psql args...]
    local user=$1 db=$2; shift 2
    "$PSQL" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U "$user" -d "$db" "$@"
}
relay_dsn() { # db [extra conninfo]
    echo "host=127.0.0.1 port=$PORT dbname=$1 user=cdc_relay password=$RELAY_PASSWORD ${2:-}"
}
relay() { # db [psql args...]
    local db=$1; shift
    "$PSQL" -X -q -v ON_ERROR_STOP=1 -At "$(relay_dsn "$db")" "$@"
}
expect_refused() { # description, then the command
    local what=$1; shift
    if out=$("$@" 2>&1); then fail "$what: expected an error, got: $out"; fi
    echo "refused as expected: $what ($(grep -m1 -o 'ERROR:.*\|FATAL:.*' <<<"$out"))"
}
run_migrations() { # label owner admin db; 004 gets the extra psql args in EXTRA_004
    local label=$1 owner=$2 admin=$3 db=$4 f
    for f in "$MIGRATIONS"/*.sql; do
        case "$(basename "$f")" in
            004_*) echo "[$label] $(basename "$f") as $admin"
                   psql_as "$admin" "$db" "${EXTRA_004[@]}" -f "$f" ;;
            *)     echo "[$label] $(basename "$f") as $owner"
                   psql_as "$owner" "$db" -f "$f" ;;
        esac
    done
}

step "compose-style: superuser runs every file, no password variable (twice)"
psql_as postgres postgres -c 'CREATE DATABASE composedb'
EXTRA_004=()
run_migrations "composedb pass 1" postgres postgres composedb
run_migrations "composedb pass 2" postgres postgres composedb

step "least privilege: owner 'app' runs 001-003, superuser runs 004 with a password (twice)"
psql_as postgres postgres -c 'CREATE ROLE app LOGIN' -c 'CREATE DATABASE relaydb OWNER app'
EXTRA_004=(-v "cdc_relay_password=$RELAY_PASSWORD")
run_migrations "relaydb pass 1" app postgres relaydb
run_migrations "relaydb pass 2" app postgres relaydb

step "003 repairs a publication that lost the outbox table"
psql_as app relaydb -c 'ALTER PUBLICATION cdc_relay_outbox DROP TABLE public.outbox_events'
psql_as app relaydb -f "$MIGRATIONS/003_publication.sql"

step "catalog state"
psql_as postgres relaydb -At -F ' ' <<'EOF'
SELECT 'role', rolname, 'login='||rolcanlogin, 'replication='||rolreplication, 'super='||rolsuper,
       'createdb='||rolcreatedb, 'createrole='||rolcreaterole, 'bypassrls='||rolbypassrls
  FROM pg_roles WHERE rolname = 'cdc_relay';
SELECT 'publication', pubname, 'owner='||pg_get_userbyid(pubowner), 'insert='||pubinsert,
       'update='||pubupdate, 'delete='||pubdelete, 'truncate='||pubtruncate
  FROM pg_publication;
SELECT 'published', pubname, schemaname||'.'||tablename FROM pg_publication_tables;
SELECT 'grant', table_name, string_agg(privilege_type, ',' ORDER BY privilege_type)
  FROM information_schema.role_table_grants WHERE grantee = 'cdc_relay' GROUP BY table_name ORDER BY 2;
SELECT 'index', indexname FROM pg_indexes WHERE tablename = 'outbox_events' ORDER BY 2;
EOF
got=$(psql_as postgres relaydb -At -c "SELECT count(*) FROM pg_publication_tables WHERE pubname='cdc_relay_outbox'")
[[ "$got" == 1 ]] || fail "publication should cover exactly one table, covers $got"
got=$(psql_as postgres relaydb -At -c "SELECT pubinsert AND NOT (pubupdate OR pubdelete OR pubtruncate) FROM pg_publication WHERE pubname='cdc_relay_outbox'")
[[ "$got" == t ]] || fail "publication should publish inserts only"
got=$(psql_as postgres relaydb -At -c "SELECT has_database_privilege('cdc_relay', 'relaydb', 'CONNECT')")
[[ "$got" == t ]] || fail "cdc_relay lacks CONNECT on relaydb"

step "cdc_relay: logical replication connection (replication=database), pg_hba has no 'replication' line"
"$PSQL" -X -v ON_ERROR_STOP=1 -At "$(relay_dsn relaydb replication=database)" -c 'IDENTIFY_SYSTEM'
"$PSQL" -X -v ON_ERROR_STOP=1 -At "$(relay_dsn relaydb replication=database)" \
    -c 'CREATE_REPLICATION_SLOT cdc_relay_check_stream LOGICAL pgoutput'

step "cdc_relay: pg_create_logical_replication_slot on a normal connection"
relay relaydb -c "SELECT slot_name, lsn FROM pg_create_logical_replication_slot('cdc_relay_check', 'pgoutput')"

step "app writes: one committed INSERT, one rolled back, then UPDATE and DELETE of the row"
psql_as app relaydb <<'EOF'
INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'order-1', 'OrderPlaced', '{"total": 42}');
BEGIN;
INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'order-2', 'OrderPlaced', '{"total": 7}');
ROLLBACK;
UPDATE public.outbox_events SET event_type = 'Changed';
DELETE FROM public.outbox_events;
INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'order-3', 'OrderPlaced', '{"total": 1}');
EOF

step "cdc_relay: the publication yields the two committed INSERTs only"
# pgoutput message types: B(egin) R(elation) I(nsert) U(pdate) D(elete) C(ommit).
types=$(relay relaydb -c "
    SELECT string_agg(chr(get_byte(data, 0)), '' ORDER BY lsn)
    FROM pg_logical_slot_peek_binary_changes('cdc_relay_check', NULL, NULL,
         'proto_version', '1', 'publication_names', 'cdc_relay_outbox')")
echo "pgoutput message types: $types"
[[ "$(tr -cd I <<<"$types")" == II ]] || fail "expected exactly two Insert messages, got: $types"
[[ "$types" != *[UDT]* ]] || fail "publication leaked UPDATE/DELETE/TRUNCATE: $types"

step "cdc_relay: stream the slot over the replication protocol (pg_recvlogical)"
endpos=$(psql_as postgres relaydb -At -c 'SELECT pg_current_wal_lsn()')
"$PG_RECVLOGICAL" -d "$(relay_dsn relaydb)" --slot cdc_relay_check_stream --start \
    -o proto_version=1 -o publication_names=cdc_relay_outbox --endpos "$endpos" \
    --no-loop -f "$WORK/stream.bin"
echo "streamed $(stat -c %s "$WORK/stream.bin") bytes up to $endpos"
[[ -s "$WORK/stream.bin" ]] || fail "nothing streamed"

step "cdc_relay: read the outbox, upsert the checkpoint (twice)"
relay relaydb -c 'SELECT count(*) AS outbox_rows FROM public.outbox_events'
for i in 1 2; do
    relay relaydb -c "
        INSERT INTO public.cdc_relay_checkpoints (slot_name, system_id, lsn, relay_name, updated_at)
        VALUES ('cdc_relay_check',
                (SELECT system_identifier::text FROM pg_control_system()),
                pg_current_wal_lsn(), 'check-migrations', now())
        ON CONFLICT (slot_name) DO UPDATE
           SET system_id = EXCLUDED.system_id, lsn = EXCLUDED.lsn,
               relay_name = EXCLUDED.relay_name, updated_at = EXCLUDED.updated_at
        RETURNING slot_name, system_id, lsn, relay_name"
done

step "cdc_relay: what it must not be able to do"
expect_refused "INSERT into outbox_events" relay relaydb -c \
    "INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('x','x','x','{}')"
expect_refused "DELETE from cdc_relay_checkpoints" relay relaydb -c 'DELETE FROM public.cdc_relay_checkpoints'
expect_refused "CREATE PUBLICATION" relay relaydb -c 'CREATE PUBLICATION p2 FOR TABLE public.outbox_events'
expect_refused "CREATE TABLE in schema public" relay relaydb -c 'CREATE TABLE public.t (i int)'
expect_refused "physical replication connection (no 'replication' line in pg_hba.conf)" \
    "$PSQL" -X -At "$(relay_dsn relaydb replication=true)" -c 'IDENTIFY_SYSTEM'

step "cleanup: drop the slots"
psql_as postgres relaydb -At -c \
    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null

printf '\nmigrations OK\n'
