package gaps

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
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
	// CheckPartitionsListed warns at start about a publication that lists a
	// partitioned outbox table's partitions one by one.
	CheckPartitionsListed = "partitions_listed"
)

// publicationChecks judge, at start, whether the publication (which exists:
// replication.CheckServer created it or refused) streams the outbox table's
// inserts (PhasePublication). Their failures are *replication.ConfigErrors.
func publicationChecks() []Check {
	return []Check{
		{CheckPublicationInserts, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
			if f.Coverage.PubInsert {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q does not publish inserts: run ALTER PUBLICATION %s SET (publish = 'insert');",
				f.Setup.Publication, pubIdent(f))})
		}},
		{CheckPublicationUpdates, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
			if !f.Setup.PublishUpdates || f.Coverage.PubUpdate {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Err: f.Setup.Names.Errorf("OnOutboxUpdate", "publication %q does not publish updates, which the relay must see to report them: run ALTER PUBLICATION %s SET (publish = 'insert, update'); or choose ignore",
				f.Setup.Publication, pubIdent(f))})
		}},
		{CheckTableCovered, judgeTableCovered(false)},
		{CheckPartitionsListed, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
			if !f.Coverage.Partitioned || f.Coverage.RootPublished {
				return Finding{}
			}
			table := f.Setup.QualifiedTable()
			return Finding{Verdict: Warn,
				Msg: fmt.Sprintf("publication %q lists the partitions of the outbox table %s one by one: a partition created or attached later is not published until it is added, and the relay stops when that happens; to publish every partition, later ones too, run ALTER PUBLICATION %s ADD TABLE %s;",
					f.Setup.Publication, table, pubIdent(f), table),
				Fields: map[string]any{"table": table}}
		}},
	}
}

// PartialCoverage judges a publication that exists and covers some of the
// outbox tables but not others (tables added to the relay's list since):
// covs are the coverages of cfg.PerTable(), in order. It returns the tables
// the relay adds to the publication, when it may change it
// (cfg.CreatePublication), or the *replication.ConfigError naming the
// statement to run; nothing when every table is covered, or none is (the
// publication checks then say what is missing). replication.CheckServer asks
// it (SetupConfig.PartialCoverage) and makes the change.
func PartialCoverage(cfg replication.SetupConfig, covs []replication.Coverage) ([]decoder.TableName, error) {
	var covered, missing []string
	var joining []decoder.TableName
	for i, t := range cfg.PerTable() {
		if i >= len(covs) {
			break
		}
		c := covs[i]
		switch {
		case c.NoTable:
		case c.Covered || c.PubAllTables:
			covered = append(covered, t.QualifiedTable())
		case c.TableOID != 0 && c.RelOID == 0 && !c.RootPublished:
			missing = append(missing, t.QualifiedTable())
			joining = append(joining, decoder.TableName{Schema: t.Schema, Table: t.Table})
		}
	}
	if len(covered) == 0 || len(missing) == 0 {
		return nil, nil
	}
	if cfg.CreatePublication {
		return joining, nil
	}
	alter := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pgx.Identifier{cfg.Publication}.Sanitize(), strings.Join(missing, ", "))
	lost := ""
	if cfg.JoinSnapshot != nil {
		lost = fmt.Sprintf(" (the relay then publishes the rows already in it from a snapshot taken with the change, so none is lost). "+
			"If you run the statement yourself instead, the rows committed into %s between the slot's position and the change are never streamed "+
			"(Postgres decodes the WAL with the publication as it was when the rows were written), so the relay's next start stops (table_joined) "+
			"and says how to publish them",
			strings.Join(missing, ", "))
	}
	return nil, &replication.ConfigError{Msg: fmt.Sprintf("publication %q does not cover outbox table %s, which the relay is configured to read beside %s: run %s (as the table owner), or let the relay add it %s%s",
		cfg.Publication, strings.Join(missing, ", "), strings.Join(covered, ", "), alter, cfg.Names.Name("CreatePublication"), lost)}
}

// A partitioned outbox table is covered when every leaf partition is: the
// publication lists it, or one of its ancestors (replication.ReadCoverage).
// A publication that includes the table itself covers every partition,
// present and future, through the root (publish_via_partition_root) or
// under their own names. One that lists partitions one by one does not
// cover a partition created or attached later: the start-up check refuses
// such a state, and the watch is loud when it arises while streaming
// (CheckTableCovered), since Postgres never streams that partition's inserts.

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
			if st == "unreserved" {
				return judgeUnreserved(f)
			}
			v := Info
			if st == "lost" || st == "missing" {
				v = Alert
			}
			return Finding{Verdict: v, Msg: "replication slot wal_status changed", Fields: walFields(f)}
		}},
		{SlotLost.String(), func(f *Facts) Finding {
			invalid, reason := f.Slot.Invalidated()
			if !invalid {
				return Finding{}
			}
			return fatal(invalidatedWhileStreaming(f.Setup.Names, f.Setup.Slot, f.Slot, reason,
				fmt.Sprintf("%s, confirmed at %s", invalidDesc(f.Slot, reason), f.Slot.ConfirmedFlush)))
		}},
		{CheckTableDropped, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
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
			return fatal(&replication.ConfigError{Msg: publicationDroppedMsg(f.Setup.Names, f.Setup.Publication, f.Setup.Slot, since(f))})
		}},
		{CheckPublicationInserts, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
			if f.Coverage.PubInsert {
				return Finding{}
			}
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("publication %q stopped publishing inserts while the relay was streaming; Postgres will never stream the inserts committed since, not even after a restart: run ALTER PUBLICATION %s SET (publish = 'insert'); and restart the relay; %s",
				f.Setup.Publication, pubIdent(f), replaySince(f))})
		}},
		{CheckTableCovered, judgeTableCovered(true)},
		{CheckTableRecreated, func(f *Facts) Finding {
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
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
			if f.Coverage.NoTable {
				return Finding{} // a message outbox alone: no table to check
			}
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

// judgeTableCovered is the one judgment of whether the publication streams
// the inserts into every relation holding the outbox table's rows, at start
// and in status (streaming false) and every monitor interval (streaming
// true). While streaming, the table was covered at start: what was not
// streamed since is lost to the slot, and the message says how to republish it.
func judgeTableCovered(streaming bool) func(f *Facts) Finding {
	return func(f *Facts) Finding {
		c := f.Coverage
		if c.NoTable || c.Covered {
			return Finding{} // a message outbox alone has no table to check
		}
		table := f.Setup.QualifiedTable()
		fix := fmt.Sprintf("run ALTER PUBLICATION %s ADD TABLE %s;", pubIdent(f), table)
		what := fmt.Sprintf("does not cover the outbox table %s", table)
		if c.Partitioned {
			what = fmt.Sprintf("does not cover partitions %s of the partitioned outbox table %s", strings.Join(c.Uncovered, ", "), table)
			fix += " (it then publishes every partition, those created or attached later too)"
		}
		msg := fmt.Sprintf("publication %q %s: %s", f.Setup.Publication, what, fix)
		if streaming {
			when := " (created, attached or removed from it while the relay was streaming)"
			if !c.Partitioned {
				what, when = "no longer covers the outbox table "+table, ""
			}
			msg = fmt.Sprintf("publication %q %s%s; Postgres will never stream the inserts committed since, not even after a restart: %s and restart the relay; %s",
				f.Setup.Publication, what, when, fix, replaySince(f))
		}
		return fatal(&replication.ConfigError{Msg: msg})
	}
}

// invalidatedWhileStreaming is the gap a running relay stops with when
// Postgres invalidated its slot (reason as SlotState.Invalidated names it, ""
// when unknown; seen says what showed it).
func invalidatedWhileStreaming(names setting.Namer, slot string, s replication.SlotState, reason, seen string) *GapError {
	return gap(SlotLost, slot, checkpoint.Checkpoint{}, s,
		"replication slot %q was invalidated while the relay was streaming (%s): %s. "+
			"The relay stops: it cannot stream from this slot again, and events committed after the last stored checkpoint "+
			"that are not in Kafka yet cannot be streamed. "+
			"To recover, either restart with backfilling on "+names.Name("Backfill")+" (the relay drops the slot, creates a new one "+
			"and republishes the outbox rows created since the stored checkpoint), or by hand: "+
			"drop the slot with %s, delete the checkpoint with %s, restart the relay, which creates a new slot, "+
			"and replay the rows committed since the stored checkpoint (`"+names.Command("status")+"` shows it) with `"+names.Command("replay", "since", "<its time>")+"`. %s",
		slot, seen, invalidCause(reason), dropSlotSQL(slot), deleteSQL(slot), invalidPrevent(reason))
}

// slotInvalidated reports whether err is the walsender's refusal to stream
// an invalidated slot, and the invalidation reason its detail names ("" when
// none). Every supported version answers SQLSTATE 55000 with a detail that
// says the slot "has been invalidated" (the message differs: "cannot read
// from logical replication slot" on 13-15, "can no longer get changes from
// replication slot" on 16-17, "can no longer access replication slot" on 18).
func slotInvalidated(err error) (bool, string) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Detail, "invalidated") {
		return false, ""
	}
	d := pgErr.Detail
	for _, r := range []string{"wal_removed", "rows_removed", "wal_level_insufficient", "idle_timeout"} {
		if strings.Contains(d, r) {
			return true, r
		}
	}
	switch {
	case strings.Contains(d, "maximum reserved size"): // 13-16
		return true, "wal_removed"
	case strings.Contains(d, "conflicting with recovery"): // 16
		return true, "conflict"
	}
	return true, ""
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
	return fmt.Sprintf("then republish the rows committed since %s that are still in the table: %s", s, f.Setup.Names.Command("replay", "since", s))
}

// publicationDroppedMsg explains a publication dropped under a running relay:
// the walsender then fails on every start at the slot's position, even after
// the publication is created again, because it decodes with the old catalog.
// since is when the publication was last seen, "" when unknown.
func publicationDroppedMsg(names setting.Namer, pub, slot, since string) string {
	replay := "republish the outbox rows committed since it was dropped: " + names.Command("replay", "since", "TIME")
	if since != "" {
		replay = fmt.Sprintf("republish the outbox rows committed since %s: %s", since, names.Command("replay", "since", since))
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
