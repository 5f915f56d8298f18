package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// StandbyMinVersion is the first server_version_num that decodes on a hot
// standby (logical slots on standbys, pg_log_standby_snapshot).
const StandbyMinVersion = 160000

// walEndSQL is the server's WAL end as SQL: on a primary its write position,
// on a standby the position it has replayed, which is as far as its
// walsenders stream (pg_current_wal_lsn() fails during recovery).
const walEndSQL = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)"

// Source is what the relay reads from: the server of the Postgres URL, a
// primary or a hot standby.
type Source struct {
	InRecovery bool // pg_is_in_recovery(): a hot standby
	Version    int  // server_version_num
}

// Role names the server for logs, status and metrics: "standby" or
// "primary".
func (s Source) Role() string {
	if s.InRecovery {
		return "standby"
	}
	return "primary"
}

// ReadSource reads whether db's server is a hot standby, and its version.
func ReadSource(ctx context.Context, db QueryRower) (Source, error) {
	var s Source
	if err := db.QueryRow(ctx, "SELECT pg_is_in_recovery(), current_setting('server_version_num')::int").Scan(&s.InRecovery, &s.Version); err != nil {
		return s, fmt.Errorf("read whether the server is a standby: %w", err)
	}
	return s, nil
}

// CheckStandbySource checks that the relay may decode on source, a hot
// standby, writing through the primary whose state is primary (nil when no
// primary URL was given). Each failure is a *ConfigError naming the fix.
func CheckStandbySource(source Source, primary *Source) error {
	if !source.InRecovery {
		return nil
	}
	if source.Version < StandbyMinVersion {
		return configErr("the Postgres URL %s names a hot standby running PostgreSQL %s, which cannot decode: logical decoding on a standby needs PostgreSQL 16 or later: point %s at the primary, or upgrade the standby",
			setting.Token("PGURL"), VersionName(source.Version), setting.Token("PGURL"))
	}
	if primary == nil {
		return configErr("the Postgres URL %s names a hot standby (pg_is_in_recovery() is true): the relay decodes there but writes its checkpoint and dead letters and emits heartbeats on the primary: give the primary's URL %s",
			setting.Token("PGURL"), setting.Token("PrimaryPGURL"))
	}
	if primary.InRecovery {
		return configErr("the primary URL %s names a server in recovery (a standby): name the primary, the server the standby %s replicates from",
			setting.Token("PrimaryPGURL"), setting.Token("PGURL"))
	}
	return nil
}

// NudgeStandby asks the primary db to log a running-transactions record
// (pg_log_standby_snapshot()) now and then every interval until ctx ends:
// creating a slot on a standby waits for the next such record, which the
// primary otherwise logs at most every 15 seconds and only while it writes.
// Errors are returned through report, which may be nil; the nudging goes on.
func NudgeStandby(ctx context.Context, db QueryRower, interval time.Duration, report func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var ignored any
		qctx, cancel := context.WithTimeout(ctx, interval+5*time.Second)
		err := db.QueryRow(qctx, "SELECT pg_log_standby_snapshot()").Scan(&ignored)
		cancel()
		if err != nil && ctx.Err() == nil && report != nil {
			report(fmt.Errorf("ask the primary for a running-transactions record (pg_log_standby_snapshot()): %w", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
