package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/report"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// DLQReplayCmd is "cdc-relay dlq replay".
type DLQReplayCmd struct {
	// In the order of their help groups (help.go).
	PGFlags       `embed:"" group:"postgres"`
	dlqStoreFlags `embed:"" group:"postgres"`

	// Not KafkaFlags: a dead letter goes back to the topic stored with it;
	// --topic here overrides that, it is no template.
	kafkaBrokerFlags   `embed:"" group:"kafka" set:"kafka_brokers_note= unless --dry-run"`
	KafkaSecurityFlags `embed:"" group:"kafka"`

	formatFlags `embed:"" group:"routing" set:"cloudevents_source_note=; required here"`
	// Topic is no run --topic: neither CDC_RELAY_TOPIC nor the config file's
	// topic key (the relay's template) may redirect a replay.
	Topic string `env:"-" nofile:"" group:"routing" help:"Publish every selected letter to this topic instead of the one stored with it (e.g. when the topic template produced a name Kafka refuses); recorded in the history. Only on the command line: CDC_RELAY_TOPIC and the config file's topic are run's." placeholder:"NAME"`

	letterFilterFlags `embed:"" group:"selection"`
	ID                []int64 `name:"id" group:"selection" help:"Only these dead letter ids (repeat the flag or separate with commas)." placeholder:"ID"`
	Force             bool    `group:"selection" help:"Also publish letters that are completed already (they are skipped otherwise)."`
	Limit             int     `group:"selection" help:"Replay at most this many letters, lowest ids first (0: all)."`

	publishFlags `embed:"" group:"replay"`
	Lease        time.Duration `default:"${default_dlq_lease}" group:"replay" help:"How long the replay's claim on the letters it publishes lasts unless renewed (it renews every third of it): after a replay dies, another one takes its letters over once this has passed."`
}

// Validate checks the flags.
func (c *DLQReplayCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if err := c.publishFlags.validate(); err != nil {
		return err
	}
	if err := c.checkKafka(&c.KafkaBrokers, &c.KafkaSecurityFlags); err != nil {
		return err
	}
	for _, id := range c.ID {
		if id <= 0 {
			return flagError("id", fmt.Sprintf("has %d: dead letter ids are positive", id))
		}
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	if err := c.formatFlags.validate(); err != nil {
		return err
	}
	if c.Topic != "" {
		if err := route.ValidTopic(c.Topic); err != nil {
			return fmt.Errorf("--topic is %q, not a topic Kafka accepts: %w", c.Topic, err) // no variable: see Topic
		}
	}
	if c.Lease < time.Second {
		return flagError("lease", "must be at least 1s, e.g. 2m")
	}
	return c.letterFilterFlags.parse(time.Now())
}

// Run publishes the selected letters and prints what the replay did.
func (c *DLQReplayCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		if err := s.Ensure(ctx); err != nil {
			return err
		}
		format, err := c.recordFormat(c.PGURL, "")
		if err != nil {
			return err
		}
		pub, done, err := c.replayPublisher(ctx, c.KafkaBrokers, &c.KafkaSecurityFlags, format, env.Stderr)
		if err != nil {
			return err
		}
		defer done()
		f := c.filter
		f.IDs, f.Limit = c.ID, c.Limit
		actor := c.actor()
		res, err := s.ReplayDeadLetters(ctx, pub, deadletter.ReplayOptions{
			Filter: f, DryRun: c.DryRun, Force: c.Force, Rate: c.Rate, BatchSize: c.BatchSize, Actor: actor,
			Topic: c.Topic, Lease: c.Lease,
		})
		return reportReplay(env.Stdout, report.ReplaySummary{Kind: "dlq", Actor: actor, DryRun: c.DryRun, Result: res}, err)
	})
}
