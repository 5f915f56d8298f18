package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

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
func CheckStandbySource(source Source, primary *Source, names setting.Namer) error {
	if !source.InRecovery {
		return nil
	}
	if source.Version < StandbyMinVersion {
		return configErr("the Postgres URL %s names a hot standby running PostgreSQL %s, which cannot decode: logical decoding on a standby needs PostgreSQL 16 or later: point %s at the primary, or upgrade the standby",
			names.Name("PGURL"), VersionName(source.Version), names.Name("PGURL"))
	}
	if primary == nil {
		return configErr("the Postgres URL %s names a hot standby (pg_is_in_recovery() is true): the relay decodes there but writes its checkpoint and dead letters and emits heartbeats on the primary: give the primary's URL %s",
			names.Name("PGURL"), names.Name("PrimaryPool"))
	}
	if primary.InRecovery {
		return configErr("the primary URL %s names a server in recovery (a standby): name the primary, the server the standby %s replicates from",
			names.Name("PrimaryPool"), names.Name("PGURL"))
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

// WaitReplayed waits until the standby has replayed the primary's WAL up to
// where the primary has written it now: what the relay wrote on the primary
// (its publication) is then in the standby's catalog, where the stream
// decodes. It polls every interval; while the standby is behind it calls
// progress, which may be nil, at once and then every report, with the
// target, the standby's replay position and the time waited. It returns
// when the standby has caught up, or with ctx's error.
func WaitReplayed(ctx context.Context, standby, primary QueryRower, interval, report time.Duration, progress func(target, replayed pglogrepl.LSN, waited time.Duration)) error {
	target, err := CurrentWAL(ctx, primary)
	if err != nil {
		return fmt.Errorf("primary: %w", err)
	}
	began := time.Now()
	var reported time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		replayed, err := CurrentWAL(ctx, standby)
		if err != nil {
			return fmt.Errorf("standby: %w", err)
		}
		if replayed >= target {
			return nil
		}
		if progress != nil && time.Since(reported) >= report {
			reported = time.Now()
			progress(target, replayed, time.Since(began))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the standby to replay the primary's WAL up to %s (replayed %s): %w", target, replayed, ctx.Err())
		case <-t.C:
		}
	}
}
