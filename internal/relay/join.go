package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
)

// A table that joins.
//
// When the relay adds an outbox table to the publication of a slot that
// exists (the table was added to its list since the slot's position), the
// slot resumes from before the change, and Postgres decodes every change
// with the publication as it was when the change was written: the rows
// committed into the table before it joined are never streamed, whatever
// position the relay resumes from. So the relay publishes them itself, from
// the transaction that adds the table (replication.JoinTables): it holds
// every row committed before the change, and the slot streams every row
// committed after it, so none is missed and none sent twice at the seam.
//
// Every row the table holds is published, with the initial snapshot on as with
// never: Postgres keeps no commit position per row, so the relay cannot tell
// the rows committed after its stored checkpoint (which never promises) from
// older ones; publishing them all is the superset that loses none.

// joinSnapshot publishes the rows of the outbox tables joining the
// publication through Config.Join, within tx, the transaction that adds
// them; replication.JoinTables commits it once this returns.
func (r *Relay) joinSnapshot(ctx context.Context, tx pgx.Tx, tables []decoder.TableName) error {
	var names []string
	for _, t := range tables {
		names = append(names, t.Schema+"."+t.Table)
	}
	if r.cfg.Join == nil {
		return errors.New("the relay was built without a way to publish the rows of an outbox table that joins the publication (Config.Join)")
	}
	r.log.Warn().Strs("tables", names).Str("publication", r.cfg.Publication).
		Msgf("outbox table %s joins publication %q while the slot resumes from before the change, so Postgres never streams the rows committed into it until now: "+
			"publishing every row it holds from the transaction that adds it (cdc_relay_snapshot: join), whatever the initial snapshot %s says; "+
			"inserts into it wait until they are in Kafka, and the stream carries those committed after",
			strings.Join(names, ", "), r.cfg.Publication, r.cfg.Names.Name("Snapshot"))
	began := time.Now()
	n, err := r.cfg.Join(ctx, tx, tables)
	if err != nil {
		return fmt.Errorf("publish the rows of the joining outbox table (%d published before the failure, published again by the next start): %w", n, err)
	}
	r.joined = append(r.joined, names...)
	r.log.Info().Strs("tables", names).Int("events", n).Dur("took", time.Since(began)).
		Msg("join snapshot done: the table joined the publication, and the stream carries its rows committed after")
	return nil
}

// tableNames are the outbox tables the relay reads, as schema.table; empty,
// not nil, for a message outbox alone.
func (r *Relay) tableNames() []string {
	names := []string{}
	for _, t := range r.setupConfig().PerTable() {
		if t.Table != "" {
			names = append(names, t.Schema+"."+t.Table)
		}
	}
	return names
}
