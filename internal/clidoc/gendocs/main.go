// Command gendocs rewrites the generated flag reference in
// docs/configuration.md from the command line's own flag definitions
// (internal/cli), with internal/clidoc:
//
//	go run ./internal/clidoc/gendocs            # or: make docs
//	go run ./internal/clidoc/gendocs -file PATH
//
// Only the region between the BEGIN/END GENERATED FLAG REFERENCE markers
// changes; the prose around it is hand-written.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cdc-relay/cdc-relay/internal/clidoc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("gendocs", flag.ContinueOnError)
	file := fs.String("file", "docs/configuration.md", "Markdown file with the generated region to rewrite")
	if err := fs.Parse(args); err != nil {
		return err
	}
	old, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("read %s: %w", *file, err)
	}
	doc, err := clidoc.UpdateReference(string(old))
	if err != nil {
		return fmt.Errorf("update %s: %w", *file, err)
	}
	if doc == string(old) {
		return nil
	}
	if err := os.WriteFile(*file, []byte(doc), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *file, err)
	}
	fmt.Printf("gendocs: rewrote the flag reference in %s\n", *file)
	return nil
}
