package cli

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// ConfigCheckCmd is "cdc-relay config check": every check of run that needs
// no connection, as Redpanda Connect's lint or Vector's validate, so that a
// configuration is known good before a deployment starts it.
type ConfigCheckCmd struct {
	runFlagSet `embed:""` // run's flags, in run's help groups
}

// BeforeApply keeps the configuration file's table entries, as run does.
func (c *ConfigCheckCmd) BeforeApply(loader *configLoader) error {
	return c.run().BeforeApply(loader)
}

// run is c's settings as run's.
func (c *ConfigCheckCmd) run() *RunCmd { return (*RunCmd)(&c.runFlagSet) }

// Run checks the settings as run does before it connects: run's flag
// checks (every declared bound, the tables and their overrides, the topic
// templates, the files it reads: --pg-url-file, TLS, tokens), then the
// relay's own checks of the configuration it would run. A failure is a
// usage error (exit 2) naming the key, the flag and where the value came
// from.
func (c *ConfigCheckCmd) Run(env Env, loader *configLoader) error {
	r := c.run()
	err := r.Validate()
	if err == nil {
		cfg, cerr := r.config(zerolog.Nop(), metrics.Discard())
		if err = cerr; err == nil {
			err = cfg.CheckSettings()
		}
	}
	if err != nil {
		return &usageError{parseError(err, loader)}
	}
	file := "no config file"
	if loader.file != nil {
		file = "config file " + loader.file.Path()
	}
	_, err = fmt.Fprintf(env.Stdout, "configuration OK (%s): %d outbox table(s), slot %s, %d Kafka broker(s); nothing was connected to (cdc-relay status checks Postgres)\n",
		file, len(r.Table), r.Slot, len(r.KafkaBrokers))
	return err
}

// Help says what config check checks and what it cannot.
func (*ConfigCheckCmd) Help() string {
	return `It takes every flag of run, as run does (from the command line, the environment, --config, --set or --debezium-config: cdc-relay run --help-all lists them), and checks what run checks before it connects: every setting's bounds and values, each tables: entry and its overrides, the topic templates, and the files run reads (--pg-url-file, TLS, tokens). Exit 0: run would start with it; exit 2: the message names the key to fix. Postgres and Kafka are not contacted.`
}
