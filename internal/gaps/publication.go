package gaps

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// The names of the publication and WAL checks.
const (
	CheckPublicationInserts = "publication_no_inserts"
	CheckPublicationUpdates = "publication_no_updates"
	CheckTableCovered       = "table_not_covered"
	CheckTableDropped       = "table_dropped"
	CheckPublicationDropped = "publication_dropped"
	CheckTableRecreated     = "table_recreated"
	CheckTableReadded       = "table_readded"
	CheckWALStatus          = "wal_status"
)

// publicationChecks judge, at start, whether the publication (which exists:
// replication.CheckServer created it or refused) streams the outbox table's
// inserts (PhasePublication). Their failures are *replication.ConfigErrors.
func publicationChecks() []Check {
	return []Check{
		{CheckPublicationInserts, func(f *Facts) Finding {
			if f.Coverage.PubInsert {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q does not publish inserts: run ALTER PUBLICATION %s SET (publish = 'insert');",
				f.Setup.Publication, pubIdent(f))})
		}},
		{CheckPublicationUpdates, func(f *Facts) Finding {
			if !f.Setup.PublishUpdates || f.Coverage.PubUpdate {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Err: setting.Errorf("OnOutboxUpdate", "publication %q does not publish updates, which the relay must see to report them: run ALTER PUBLICATION %s SET (publish = 'insert, update'); or choose ignore",
				f.Setup.Publication, pubIdent(f))})
		}},
		{CheckTableCovered, func(f *Facts) Finding {
			if f.Coverage.PubAllTables || f.Coverage.Covered {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q does not cover the outbox table %s: run ALTER PUBLICATION %s ADD TABLE %s;",
				f.Setup.Publication, table, pubIdent(f), table)})
		}},
	}
}

// watchChecks judge, every monitor interval, the slot's WAL status and
// whether the publication still publishes the outbox table's INSERTs
// (PhaseWatch).
//
// Postgres decodes each change with the catalog as it was when the change was
// written. An INSERT made while the table was outside the publication (dropped
// and recreated, removed from it, or the publication's publish option without
// 'insert') is never sent, not even when the relay restarts from an earlier
// position: the relay cannot read it, so it must say so. Changes that are undone
// within one check interval can only be seen through the table's oid (dropped and
// recreated) and its pg_publication_rel row (removed and added back).
func watchChecks() []Check {
	return []Check{
		{CheckWALStatus, func(f *Facts) Finding {
			st, was := walStatus(f.Slot), f.Prev.WALStatus
			if st == was || (was == "" && st == "reserved") {
				return Finding{}
			}
			v := Info
			if st == "unreserved" || st == "lost" || st == "missing" {
				v = Alert
			}
			return Finding{Verdict: v, Msg: "replication slot wal_status changed",
				Fields: map[string]any{"wal_status": st, "was": was}}
		}},
		{CheckTableDropped, func(f *Facts) Finding {
			if f.Coverage.TableOID != 0 {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("outbox table %s was dropped while the relay was streaming: create it and add it to the publication in one transaction (BEGIN; CREATE TABLE %s ...; ALTER PUBLICATION %s ADD TABLE %s; COMMIT;) and restart the relay; %s",
				table, table, pubIdent(f), table, replaySince(f))})
		}},
		{CheckPublicationDropped, func(f *Facts) Finding {
			if f.Coverage.PubExists {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Msg: publicationDroppedMsg(f.Setup.Publication, f.Setup.Slot, since(f))})
		}},
		{CheckPublicationInserts, func(f *Facts) Finding {
			if f.Coverage.PubInsert {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q stopped publishing inserts while the relay was streaming; Postgres will never stream the inserts committed since, not even after a restart: run ALTER PUBLICATION %s SET (publish = 'insert'); and restart the relay; %s",
				f.Setup.Publication, pubIdent(f), replaySince(f))})
		}},
		{CheckTableCovered, func(f *Facts) Finding {
			if f.Coverage.Covered {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q no longer covers the outbox table %s; Postgres will never stream the inserts committed since, not even after a restart: run ALTER PUBLICATION %s ADD TABLE %s; and restart the relay; %s",
				f.Setup.Publication, table, pubIdent(f), table, replaySince(f))})
		}},
		{CheckTableRecreated, func(f *Facts) Finding {
			if !f.Prev.Seen || f.Coverage.TableOID == f.Prev.TableOID {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return Finding{Verdict: Alert,
				Msg: fmt.Sprintf("outbox table %s was dropped and recreated while the relay was streaming; rows inserted into the new table before it joined publication %q were not streamed (none if it joined in the transaction that created it, before any insert): check, %s",
					table, f.Setup.Publication, replaySince(f)),
				Fields: map[string]any{"table": table, "old_oid": f.Prev.TableOID, "new_oid": f.Coverage.TableOID}}
		}},
		{CheckTableReadded, func(f *Facts) Finding {
			// A recreated table has a new pg_publication_rel row too: said once, above.
			if !f.Prev.Seen || f.Coverage.TableOID != f.Prev.TableOID || f.Coverage.RelOID == f.Prev.RelOID {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return Finding{Verdict: Alert,
				Msg: fmt.Sprintf("outbox table %s was removed from publication %q and added back while the relay was streaming; inserts committed in between were not streamed; %s",
					table, f.Setup.Publication, replaySince(f)),
				Fields: map[string]any{"table": table}}
		}},
	}
}

// walStatus is the slot's wal_status, "missing" when it does not exist.
func walStatus(s replication.SlotState) string {
	if !s.Exists {
		return "missing"
	}
	return s.WALStatus
}

func pubIdent(f *Facts) string { return pgx.Identifier{f.Setup.Publication}.Sanitize() }

// since is when the watch last saw the table covered, as RFC 3339.
func since(f *Facts) string { return f.Prev.LastOK.UTC().Format(time.RFC3339) }

func replaySince(f *Facts) string {
	s := since(f)
	return fmt.Sprintf("then republish the rows committed since %s that are still in the table: cdc-relay replay --since %s", s, s)
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
	return fmt.Sprintf("publication %q was dropped while the relay was streaming; Postgres cannot stream the outbox from the slot's WAL past that point, even after the publication is created again (up to 17 it fails, from 18 it skips the rows): "+
		"create it (CREATE PUBLICATION %s FOR TABLE ... WITH (publish = 'insert');), then move slot %q past its creation: stop the relay, run SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn());, "+
		"follow the start-up message about the checkpoint, and %s",
		pub, pgx.Identifier{pub}.Sanitize(), slot, slot, replay)
}

// publicationDropped reports whether err is the walsender's "publication does
// not exist" (an error up to PostgreSQL 17) or its "skipped loading
// publication" (a warning from 18, which then decodes on without the
// publication and so skips the outbox rows): no reconnect can cure either.
func publicationDropped(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "42704" && strings.HasPrefix(pgErr.Message, "publication ") ||
		pgErr.Code == "55000" && strings.HasPrefix(pgErr.Message, "skipped loading publication ")
}
