package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// pubWatch checks, while the relay streams, that the publication still
// publishes the outbox table's INSERTs (DESIGN invariant 6).
//
// Postgres decodes each change with the catalog as it was when the change was
// written. An INSERT made while the table was outside the publication (dropped
// and recreated, removed from it, or the publication's publish option without
// 'insert') is never sent, not even when the relay restarts from an earlier
// position: the relay cannot read it, so it must say so. Changes that are undone
// within one check interval can only be seen through the table's oid (dropped and
// recreated) and its pg_publication_rel row (removed and added back).
type pubWatch struct {
	pool  *pgxpool.Pool
	cfg   replication.SetupConfig
	log   zerolog.Logger
	fatal chan<- error // gets one *replication.ConfigError; the relay stops

	seen     bool
	tableOID uint32    // the outbox table's oid at the last check
	relOID   uint32    // its pg_publication_rel row (0: covered by FOR ALL TABLES or TABLES IN SCHEMA)
	lastOK   time.Time // when the table was last seen covered
	stopped  bool
}

// check compares the catalog with the last check. A state the relay cannot
// stream from is reported on fatal; a gap that has closed again is logged.
func (w *pubWatch) check(ctx context.Context) {
	if w == nil || w.stopped {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	table := w.cfg.QualifiedTable()
	c, err := replication.ReadCoverage(qctx, w.pool, w.cfg)
	if err != nil {
		return // Postgres unreachable: the stream reports that
	}
	now := time.Now()
	since := w.lastOK.UTC().Format(time.RFC3339)
	pub := pgx.Identifier{w.cfg.Publication}.Sanitize()
	replay := fmt.Sprintf("then republish the rows committed since %s that are still in the table: cdc-relay replay --since %s", since, since)
	switch {
	case c.TableOID == 0:
		w.stop(fmt.Sprintf("outbox table %s was dropped while the relay was streaming: create it and add it to the publication in one transaction (BEGIN; CREATE TABLE %s ...; ALTER PUBLICATION %s ADD TABLE %s; COMMIT;) and restart the relay; %s",
			table, table, pub, table, replay))
		return
	case !c.PubExists:
		w.stop(publicationDroppedMsg(w.cfg.Publication, w.cfg.Slot, since))
		return
	case !c.PubInsert:
		w.stop(fmt.Sprintf("publication %q stopped publishing inserts while the relay was streaming; Postgres will never stream the inserts committed since, not even after a restart: run ALTER PUBLICATION %s SET (publish = 'insert'); and restart the relay; %s",
			w.cfg.Publication, pub, replay))
		return
	case !c.Covered:
		w.stop(fmt.Sprintf("publication %q no longer covers the outbox table %s; Postgres will never stream the inserts committed since, not even after a restart: run ALTER PUBLICATION %s ADD TABLE %s; and restart the relay; %s",
			w.cfg.Publication, table, pub, table, replay))
		return
	}
	if w.seen {
		switch {
		case c.TableOID != w.tableOID:
			w.log.Error().Str("table", table).Uint32("old_oid", w.tableOID).Uint32("new_oid", c.TableOID).
				Msgf("outbox table %s was dropped and recreated while the relay was streaming; rows inserted into the new table before it joined publication %q were not streamed (none if it joined in the transaction that created it, before any insert): check, %s",
					table, w.cfg.Publication, replay)
		case c.RelOID != w.relOID:
			w.log.Error().Str("table", table).
				Msgf("outbox table %s was removed from publication %q and added back while the relay was streaming; inserts committed in between were not streamed; %s",
					table, w.cfg.Publication, replay)
		}
	}
	w.seen, w.tableOID, w.relOID, w.lastOK = true, c.TableOID, c.RelOID, now
}

func (w *pubWatch) stop(msg string) {
	w.stopped = true
	w.log.Error().Msg(msg)
	select {
	case w.fatal <- &replication.ConfigError{Msg: msg}:
	default:
	}
}

// publicationDroppedMsg explains a publication dropped under a running relay:
// the walsender then fails on every start at the slot's position, even after
// the publication is created again, because it decodes with the old catalog.
// since is when the publication was last seen, "" when unknown.
func publicationDroppedMsg(pub, slot, since string) string {
	replay := "republish the outbox rows committed since it was dropped: cdc-relay replay --since TIME"
	if since != "" {
		replay = fmt.Sprintf("republish the outbox rows committed since %s: cdc-relay replay --since %s", since, since)
	}
	return fmt.Sprintf("publication %q was dropped while the relay was streaming; Postgres cannot decode the slot's WAL past that point, even after the publication is created again: "+
		"create it (CREATE PUBLICATION %s FOR TABLE ... WITH (publish = 'insert');), then move slot %q past its creation: stop the relay, run SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn());, "+
		"follow the start-up message about the checkpoint, and %s",
		pub, pgx.Identifier{pub}.Sanitize(), slot, slot, replay)
}

// publicationDropped reports whether err is the walsender's "publication does
// not exist", which no reconnect can cure.
func publicationDropped(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704" && strings.HasPrefix(pgErr.Message, "publication ")
}
