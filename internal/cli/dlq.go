package cli

// DLQCmd is "cdc-relay dlq": the dead-letter store's commands.
type DLQCmd struct {
	List    DLQListCmd    `cmd:"" help:"List dead letters, with a summary per error code."`
	Show    DLQShowCmd    `cmd:"" help:"Show dead letters (by id or event id) with every field and their payload."`
	Replay  DLQReplayCmd  `cmd:"" help:"Publish dead letters again to their topic (or --topic), keeping their event id; concurrent replays never publish a letter twice."`
	Purge   DLQPurgeCmd   `cmd:"" help:"Delete old dead letters."`
	History DLQHistoryCmd `cmd:"" help:"List past replays (dlq and outbox), the results of one, or the letters' state transitions."`
}
