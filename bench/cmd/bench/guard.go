package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cdc-relay/cdc-relay/bench/internal/baseline"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// repoPath resolves a path flag's value: a relative path is taken from the
// repository's root (make runs bench there).
func repoPath(root, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

// guard prints the block comparing res's drain and table cells with the
// baseline file at path (shown as name) to w, and returns a missed target
// for each RISE and DROP.
// A baseline it cannot read is said, never an error: the guard informs.
func guard(w io.Writer, path, name string, res *results.Results) []results.Target {
	if len(res.Cells) == 0 && len(res.TableCells) == 0 {
		return nil
	}
	f, err := baseline.Load(path)
	if err != nil {
		fmt.Fprintf(w, "\nagainst the baseline: %v\n", err)
		return nil
	}
	fmt.Fprintf(w, "\nagainst the baseline (%s):\n", name)
	var rises []results.Target
	for _, c := range res.Cells {
		base, ok := f.Cells[c.Name]
		if !ok {
			fmt.Fprintf(w, "  %-22s no baseline\n", c.Name)
			continue
		}
		v := baseline.Compare(base, c)
		fmt.Fprintf(w, "  %-22s %s\n", c.Name, v)
		if v.Mark == baseline.Rise {
			rises = append(rises, results.Target{Name: "regression guard " + c.Name, Got: fmt.Sprintf("RISE %s (baseline %s, %s)", v, base.Commit, base.Recorded)})
		}
	}
	for _, c := range res.TableCells {
		base, ok := f.Cells[c.Name]
		if !ok || base.RowsPerSecond <= 0 {
			fmt.Fprintf(w, "  %-22s no baseline\n", c.Name)
			continue
		}
		v := baseline.CompareRate(base, c)
		fmt.Fprintf(w, "  %-22s %s\n", c.Name, v)
		if v.Mark == baseline.Drop {
			rises = append(rises, results.Target{Name: "regression guard " + c.Name, Got: fmt.Sprintf("DROP %s (baseline %s, %s)", v, base.Commit, base.Recorded)})
		}
	}
	return rises
}

// writeBaseline records res's drain and table cells, measured at the repository's
// commit, into the baseline file at path, replacing those cells.
func writeBaseline(ctx context.Context, root, path string, res *results.Results) error {
	cells, err := baseline.Record(res)
	if err != nil {
		return fmt.Errorf("-write-baseline: %w", err)
	}
	f, err := baseline.Load(path)
	if err != nil {
		return fmt.Errorf("-write-baseline: %w", err)
	}
	commit := headCommit(ctx, root)
	for name, c := range cells {
		c.Commit = commit
		f.Cells[name] = c
	}
	if err := f.Save(path); err != nil {
		return fmt.Errorf("-write-baseline: %w", err)
	}
	return nil
}

// headCommit is the repository's HEAD, short, with "+dirty" when the work
// tree differs from it outside the benchmark's own outputs ("" when git
// cannot tell).
func headCommit(ctx context.Context, root string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(out))
	if diff, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/baseline.json", ":!bench/results").Output(); err == nil && len(strings.TrimSpace(string(diff))) > 0 {
		commit += "+dirty"
	}
	return commit
}
