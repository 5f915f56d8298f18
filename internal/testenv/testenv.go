// Package testenv holds the helpers tests share: waiting for a condition
// with a deadline (Eventually), the sandbox's servers bound to a test
// (NewPostgres, NewKafka: fail on error, skip where an external server
// cannot serve, close when the test ends), an in-process OTLP trace receiver,
// and readers of what Postgres and Kafka saw (WaitStatusUpdates,
// CountStatements, MustReadAll, ProduceError for kfake faults).
//
// The servers themselves live in internal/sandbox, which non-test programs
// (the demo, the benchmarks, the fault-injection tool) use without package
// testing; only tests import testenv.
package testenv
