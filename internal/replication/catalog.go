package replication

// Catalog facts the relay reads or changes outside the replication protocol:
// one query per fact, shared by the start-up checks and the watches that
// re-check them while streaming.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
)

// Coverage is what the catalog says about the outbox table and the
// publication.
type Coverage struct {
	TableOID     uint32 // 0 when the table does not exist
	PubExists    bool
	PubInsert    bool // the publication publishes inserts
	PubUpdate    bool // the publication publishes updates
	PubAllTables bool // FOR ALL TABLES
	// PubViaRoot: the publication publishes partitions' changes as their
	// root's (publish_via_partition_root).
	PubViaRoot bool
	// Partitioned: the table is partitioned (relkind p); its rows live in
	// its leaf partitions.
	Partitioned bool
	// Leaves is how many relations hold the table's rows: 1 for a plain
	// table, its leaf partitions for a partitioned one.
	Leaves int
	// Uncovered names (schema.table, quoted as needed) the relations holding
	// the table's rows whose inserts the publication does not stream: the
	// table itself, or leaf partitions that neither pg_publication_tables
	// nor any of their ancestors there list. At most maxUncovered.
	Uncovered []string
	// RootPublished: the publication includes the table itself (FOR TABLE,
	// FOR ALL TABLES, or on 15+ TABLES IN SCHEMA of its schema), so it also
	// streams partitions created or attached later. False for a publication
	// that lists a partitioned table's partitions one by one.
	RootPublished bool
	// Covered: the publication streams the inserts into every relation
	// holding the table's rows (Uncovered is empty and the table exists).
	Covered bool
	// RelOID is the table's pg_publication_rel row; 0 when it is covered by
	// FOR ALL TABLES or TABLES IN SCHEMA (or not at all).
	RelOID uint32
	// NoTable: the relay reads no table (SetupConfig.NoTable); only
	// PubExists was read, and the table's checks do not apply.
	NoTable bool
}

// maxUncovered bounds Coverage.Uncovered, for the message.
const maxUncovered = 20

// ReadCoverage reads the Coverage of cfg's table by cfg's publication.
//
// A relation holding the table's rows (a plain table, or each leaf
// partition) is streamed when pg_publication_tables lists it or one of its
// ancestors (pg_partition_ancestors, PostgreSQL 12+): the view lists the
// root under publish_via_partition_root and the leaves otherwise.
func ReadCoverage(ctx context.Context, db QueryRower, cfg SetupConfig) (Coverage, error) {
	if cfg.NoTable() {
		c := Coverage{NoTable: true}
		if err := db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&c.PubExists); err != nil {
			return Coverage{}, fmt.Errorf("check publication %q exists: %w", cfg.Publication, err)
		}
		return c, nil
	}
	c, err := readCoverage(ctx, db, cfg)
	if err == nil && !c.Covered && c.TableOID != 0 {
		// The query mixes the statement's snapshot (pg_class) with the
		// catalog caches (to_regclass, pg_publication_tables), which see DDL
		// that commits while it runs: a table dropped meanwhile can look
		// present and uncovered. A second read sees the DDL throughout.
		return readCoverage(ctx, db, cfg)
	}
	return c, err
}

func readCoverage(ctx context.Context, db QueryRower, cfg SetupConfig) (Coverage, error) {
	var (
		c                Coverage
		tableOID, relOID *uint32
		leaves, version  int32
	)
	err := db.QueryRow(ctx, `WITH tab AS (SELECT to_regclass($1)::oid AS oid),
	leaves AS (
		SELECT c.oid AS relid FROM pg_class c, tab WHERE c.oid = tab.oid AND c.relkind <> 'p'
		UNION ALL
		SELECT t.relid FROM tab, pg_partition_tree(tab.oid) t WHERE t.isleaf),
	listed AS (
		SELECT c.oid FROM pg_publication_tables t
		JOIN pg_namespace n ON n.nspname = t.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
		WHERE t.pubname = $2),
	uncovered AS (
		SELECT l.relid FROM leaves l WHERE NOT EXISTS (SELECT 1 FROM listed
			WHERE listed.oid = l.relid OR listed.oid IN (SELECT a.relid FROM pg_partition_ancestors(l.relid) a)))
	SELECT tab.oid, p.oid IS NOT NULL, coalesce(p.pubinsert, false), coalesce(p.pubupdate, false), coalesce(p.puballtables, false),
		coalesce(p.pubviaroot, false),
		coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = tab.oid), false),
		(SELECT count(*)::int4 FROM leaves),
		(SELECT coalesce(array_agg(relid::regclass::text ORDER BY relid::regclass::text), '{}') FROM (SELECT relid FROM uncovered LIMIT `+fmt.Sprint(maxUncovered)+`) u),
		(SELECT r.oid FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = tab.oid),
		coalesce(p.puballtables, false) OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid
			AND (r.prrelid = tab.oid OR r.prrelid IN (SELECT a.relid FROM pg_partition_ancestors(tab.oid) a))),
		current_setting('server_version_num')::int4
	FROM tab LEFT JOIN pg_publication p ON p.pubname = $2`,
		cfg.QualifiedTable(), cfg.Publication).
		Scan(&tableOID, &c.PubExists, &c.PubInsert, &c.PubUpdate, &c.PubAllTables, &c.PubViaRoot, &c.Partitioned, &leaves, &c.Uncovered, &relOID, &c.RootPublished, &version)
	if err != nil {
		return Coverage{}, fmt.Errorf("check publication %q covers %s: %w", cfg.Publication, cfg.QualifiedTable(), err)
	}
	c.Leaves = int(leaves)
	if tableOID != nil {
		c.TableOID = *tableOID
	}
	if relOID != nil {
		c.RelOID = *relOID
	}
	c.Covered = c.TableOID != 0 && c.PubExists && len(c.Uncovered) == 0
	if c.PubExists && c.TableOID != 0 && !c.RootPublished && version >= 150000 {
		// TABLES IN SCHEMA (pg_publication_namespace, 15+).
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_namespace pn
			JOIN pg_publication p ON p.oid = pn.pnpubid JOIN pg_class c ON c.relnamespace = pn.pnnspid
			WHERE p.pubname = $1 AND c.oid = $2::oid)`, cfg.Publication, c.TableOID).Scan(&c.RootPublished)
		if err != nil {
			return Coverage{}, fmt.Errorf("check publication %q covers the schema of %s: %w", cfg.Publication, cfg.QualifiedTable(), err)
		}
	}
	return c, nil
}

// ReadMembership judges, from the catalog as it is now, whether relation
// rel (announced by a Relation message of cfg's publication under another
// name than cfg's table) holds outbox rows (decoder.Membership):
//
//   - it is a partition of the table (the table is among its ancestors,
//     pg_partition_ancestors): decoder.IsMember;
//   - otherwise, when the publication streams it on its own account (it or
//     one of its ancestors is in pg_publication_tables): another table, or a
//     detached partition the publication lists by name, whose inserts after
//     the detach are not outbox rows: decoder.Lookalike, naming the first of
//     cfg's tables whose columns (names and types, pg_attribute) it has
//     exactly, no more, no fewer, as a partition has its table's; else
//     decoder.NotMember;
//   - otherwise Postgres streamed its change although nothing publishes it
//     now, so when the change was written it was published through the
//     outbox table: a partition detached or dropped since, whose changes the
//     relay is still catching up on: decoder.FormerMember (or a table
//     removed from the publication since; the decoder takes it only when it
//     has the outbox columns).
func ReadMembership(ctx context.Context, db QueryRower, cfg SetupConfig, rel decoder.Relation) (decoder.Member, decoder.TableName, error) {
	var (
		exists, published bool
		parent            []string // schema and name of the outbox table rel is a partition of
		like              []string // schema and name of the outbox table whose columns rel has
	)
	err := db.QueryRow(ctx, `WITH cols AS (SELECT a.attrelid, array_agg(a.attname::text || ' ' || a.atttypid::text ORDER BY a.attname) AS cols
			FROM pg_attribute a WHERE a.attnum > 0 AND NOT a.attisdropped
			AND (a.attrelid = $2::oid OR a.attrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t))
			GROUP BY a.attrelid)
		SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = $2::oid),
		(SELECT ARRAY[n.nspname::text, c.relname::text] FROM pg_partition_ancestors($2::oid::regclass) a
			JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE a.relid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t) LIMIT 1),
		EXISTS (SELECT 1 FROM pg_publication_tables t
			JOIN pg_namespace n ON n.nspname = t.schemaname
			JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
			WHERE t.pubname = $3 AND (c.oid = $2::oid OR c.oid IN (SELECT a.relid FROM pg_partition_ancestors($2::oid::regclass) a))),
		(SELECT ARRAY[n.nspname::text, c.relname::text] FROM unnest($1::text[]) WITH ORDINALITY u(t, i)
			JOIN pg_class c ON c.oid = to_regclass(u.t) JOIN pg_namespace n ON n.oid = c.relnamespace
			JOIN cols tc ON tc.attrelid = c.oid JOIN cols rc ON rc.attrelid = $2::oid
			WHERE c.oid <> $2::oid AND tc.cols = rc.cols ORDER BY u.i LIMIT 1)`,
		cfg.qualifiedTables(), rel.ID, cfg.Publication).Scan(&exists, &parent, &published, &like)
	if err != nil {
		return decoder.NotMember, decoder.TableName{}, fmt.Errorf("look up whether relation %q.%q (oid %d) is a partition of %s: %w", rel.Namespace, rel.Name, rel.ID, strings.Join(cfg.qualifiedTables(), ", "), err)
	}
	switch {
	case len(parent) == 2:
		return decoder.IsMember, decoder.TableName{Schema: parent[0], Table: parent[1]}, nil
	case exists && published && len(like) == 2:
		return decoder.Lookalike, decoder.TableName{Schema: like[0], Table: like[1]}, nil
	case exists && published:
		return decoder.NotMember, decoder.TableName{}, nil
	}
	return decoder.FormerMember, decoder.TableName{}, nil
}

// ReadPartitions returns, from the catalog as it is now, the outbox table
// of cfg each partition (at any depth, pg_partition_tree) belongs to, by the
// partition's OID: what decoder.RememberMembers keeps, so that rows of a
// partition detached or dropped later are still attributed to its table.
func ReadPartitions(ctx context.Context, db QueryRower, cfg SetupConfig) (map[uint32]decoder.TableName, error) {
	var (
		oids          []int64
		schemas, tabs []string
	)
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(p.relid::int8 ORDER BY p.relid), '{}'),
			coalesce(array_agg(n.nspname::text ORDER BY p.relid), '{}'), coalesce(array_agg(c.relname::text ORDER BY p.relid), '{}')
		FROM unnest($1::text[]) t CROSS JOIN LATERAL pg_partition_tree(to_regclass(t)) p
		JOIN pg_class c ON c.oid = to_regclass(t) JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE p.level > 0`, cfg.qualifiedTables()).Scan(&oids, &schemas, &tabs)
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s: %w", strings.Join(cfg.qualifiedTables(), ", "), err)
	}
	m := make(map[uint32]decoder.TableName, len(oids))
	for i, oid := range oids {
		m[uint32(oid)] = decoder.TableName{Schema: schemas[i], Table: tabs[i]}
	}
	return m, nil
}

// CurrentDatabase returns the name of the database db is connected to.
func CurrentDatabase(ctx context.Context, db QueryRower) (string, error) {
	var name string
	if err := db.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		return "", fmt.Errorf("read current database: %w", err)
	}
	return name, nil
}

// ServerClock returns the server's clock now (clock_timestamp()).
func ServerClock(ctx context.Context, db QueryRower) (time.Time, error) {
	var t time.Time
	if err := db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the server clock: %w", err)
	}
	return t, nil
}

// CurrentWAL returns the server's current WAL end (pg_current_wal_lsn(), on
// a standby pg_last_wal_replay_lsn()): every transaction committing, or
// replayed, later has a higher commit LSN.
func CurrentWAL(ctx context.Context, db QueryRower) (pglogrepl.LSN, error) {
	var text string
	if err := db.QueryRow(ctx, "SELECT "+walEndSQL+"::text").Scan(&text); err != nil {
		return 0, fmt.Errorf("read the current WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return 0, fmt.Errorf("parse the current WAL position %q: %w", text, err)
	}
	return lsn, nil
}

// DropSlot drops the replication slot named slot.
func DropSlot(ctx context.Context, db QueryRower, slot string) error {
	var ignored any
	if err := db.QueryRow(ctx, "SELECT pg_drop_replication_slot($1)", slot).Scan(&ignored); err != nil {
		return fmt.Errorf("drop replication slot %q: %w", slot, err)
	}
	return nil
}

// EmitHeartbeat writes a logical decoding message (prefix cdc_relay_heartbeat,
// not transactional), so an idle database's slot has WAL to move past.
func EmitHeartbeat(ctx context.Context, db QueryRower) error {
	var lsn any
	if err := db.QueryRow(ctx, "SELECT pg_logical_emit_message(false, 'cdc_relay_heartbeat', now()::text)").Scan(&lsn); err != nil {
		return fmt.Errorf("write heartbeat: %w", err)
	}
	return nil
}

// PublishedTables returns the tables publication pub streams the changes
// of (pg_publication_tables), as schema.table sorted, each partition
// as its partitioned root (pg_partition_root): whether the publication lists
// a partitioned table's root (publish_via_partition_root) or its leaves, the
// root's rows are streamed. at is a WAL position at or past the commit of
// every publication change the answer sees (the insert position on a
// primary, which async commits do not pass; the replayed one on a standby):
// a transaction committed after it is decoded with every table returned
// published, as long as none leaves the publication. One query over the
// publication's tables: for starts, not for every checkpoint.
func PublishedTables(ctx context.Context, db *pgx.Conn, pub string) (tables []string, at pglogrepl.LSN, err error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT rn.nspname || '.' || rc.relname AS name
		FROM pg_catalog.pg_publication_tables t
		JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
		JOIN pg_catalog.pg_class rc ON rc.oid = coalesce(pg_partition_root(c.oid), c.oid)
		JOIN pg_catalog.pg_namespace rn ON rn.oid = rc.relnamespace
		WHERE t.pubname = $1`, pub)
	if err != nil {
		return nil, 0, fmt.Errorf("list the tables publication %q streams: %w", pub, err)
	}
	tables = []string{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("list the tables publication %q streams: %w", pub, err)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("list the tables publication %q streams: %w", pub, err)
	}
	slices.Sort(tables)
	// Read after the list: every change it saw committed before this.
	var text string
	if err := db.QueryRow(ctx, "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)::text").Scan(&text); err != nil {
		return nil, 0, fmt.Errorf("read the WAL position after listing the tables of publication %q: %w", pub, err)
	}
	if at, err = pglogrepl.ParseLSN(text); err != nil {
		return nil, 0, fmt.Errorf("parse the WAL position %q: %w", text, err)
	}
	return tables, at, nil
}
