// Package clidoc generates the reference of every command's flags in
// docs/configuration.md from the command line's model itself (cli.Model), so
// it cannot drift from the flags the relay takes: `make docs` (go run
// ./internal/clidoc/gendocs) rewrites it and TestConfigurationReferenceCurrent
// fails when it is stale.
package clidoc

import (
	"fmt"
	"io"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/cli"
)

// ReferenceBegin and ReferenceEnd mark the generated region of
// docs/configuration.md; everything between them is WriteReference's output.
const (
	ReferenceBegin = "<!-- BEGIN GENERATED FLAG REFERENCE: make docs rewrites this region; do not edit by hand -->"
	ReferenceEnd   = "<!-- END GENERATED FLAG REFERENCE -->"
)

// WriteReference writes, as Markdown, every command of the command line with
// each of its flags: name, environment variable, configuration file key,
// default and help, grouped by the flag's kong group where it has one. It
// reads the model exactly as the relay builds it (cli.Model), so groups,
// defaults and interpolated help are the ones --help shows.
func WriteReference(w io.Writer) error {
	app, err := cli.Model()
	if err != nil {
		return err
	}
	return writeReference(w, app.Node)
}

// writeReference is WriteReference over any command line model.
func writeReference(w io.Writer, root *kong.Node) error {
	r := &refWriter{w: w, program: root.Name}
	if len(visibleFlags(root.Flags)) > 0 {
		r.printf("### Flags every command takes\n\n")
		r.flags(root.Flags)
	}
	for _, n := range root.Children {
		r.command(n)
	}
	return r.err
}

// refWriter accumulates the first write error, so the walk reads straight.
type refWriter struct {
	w       io.Writer
	err     error
	program string // the root command's name
	// printed are the commands whose flags were written in full, so a
	// command taking all of one's flags (config print takes run's) refers
	// to it instead of repeating them.
	printed []printedFlags
}

type printedFlags struct {
	path  string
	flags []*kong.Flag
}

// largestPrinted returns the command printed in full with the most flags
// (at least 5, so the shared Postgres flags alone do not count) that flags
// all include, and the flags it lacks; "" when there is none.
func (r *refWriter) largestPrinted(flags []*kong.Flag) (string, []*kong.Flag) {
	have := map[string]bool{}
	for _, f := range flags {
		have[signature(f)] = true
	}
	best := -1
	for i, p := range r.printed {
		if len(p.flags) < 5 || (best >= 0 && len(p.flags) <= len(r.printed[best].flags)) {
			continue
		}
		all := true
		for _, f := range p.flags {
			all = all && have[signature(f)]
		}
		if all {
			best = i
		}
	}
	if best < 0 {
		return "", nil
	}
	in := map[string]bool{}
	for _, f := range r.printed[best].flags {
		in[signature(f)] = true
	}
	var rest []*kong.Flag
	for _, f := range flags {
		if !in[signature(f)] {
			rest = append(rest, f)
		}
	}
	return r.printed[best].path, rest
}

func (r *refWriter) printf(format string, args ...any) {
	if r.err == nil {
		_, r.err = fmt.Fprintf(r.w, format, args...)
	}
}

// command writes n and its subcommands; a command without flags or arguments
// of its own and with subcommands (dlq, config) is only a heading's prefix.
func (r *refWriter) command(n *kong.Node) {
	if n.Hidden {
		return
	}
	flags := visibleFlags(n.Flags)
	if len(n.Children) == 0 || len(flags) > 0 || len(n.Positional) > 0 {
		path := r.program + " " + n.Path()
		r.printf("### `%s`\n\n%s\n\n", path, n.Help)
		if len(n.Positional) > 0 {
			r.printf("Arguments:\n\n")
			for _, p := range n.Positional {
				req := ""
				if p.Required {
					req = " (required)"
				}
				r.printf("- `%s`%s: %s\n", p.Summary(), req, refLine(p.Help))
			}
			r.printf("\n")
		}
		base, rest := r.largestPrinted(flags)
		switch {
		case len(flags) == 0:
			r.printf("No flags of its own.\n\n")
		case base != "" && len(rest) == 0:
			r.printf("Takes exactly the flags of `%s`, above.\n\n", base)
		case base != "":
			r.printf("Takes every flag of `%s`, above, and:\n\n", base)
			r.flags(rest)
		default:
			r.printed = append(r.printed, printedFlags{path: path, flags: flags})
			r.flags(flags)
		}
	}
	for _, c := range n.Children {
		r.command(c)
	}
}

// flags writes one table per kong group, in the order the groups first
// appear, then the flags without a group; without groups, one table. Groups
// are told apart by key: kong builds a Group value per tagged field.
func (r *refWriter) flags(all []*kong.Flag) {
	all = visibleFlags(all)
	var order []*kong.Group
	byGroup := map[string][]*kong.Flag{}
	var ungrouped []*kong.Flag
	for _, f := range all {
		if f.Group == nil {
			ungrouped = append(ungrouped, f)
			continue
		}
		if _, ok := byGroup[f.Group.Key]; !ok {
			order = append(order, f.Group)
		}
		byGroup[f.Group.Key] = append(byGroup[f.Group.Key], f)
	}
	for _, g := range order {
		r.printf("**%s**", groupTitle(g))
		if g.Description != "" {
			r.printf(": %s", refLine(g.Description))
		}
		r.printf("\n\n")
		r.table(byGroup[g.Key])
	}
	if len(ungrouped) > 0 {
		if len(order) > 0 {
			r.printf("**Other flags**\n\n")
		}
		r.table(ungrouped)
	}
}

func (r *refWriter) table(flags []*kong.Flag) {
	r.printf("| flag | environment variable | config file key | default | |\n|---|---|---|---|---|\n")
	for _, f := range flags {
		r.printf("| %s | %s | %s | %s | %s |\n", flagName(f), envCell(f), keyCell(f), defaultCell(f), cell(helpText(f)))
	}
	r.printf("\n")
}

// visibleFlags drops --help, --help-all and hidden flags, which --help-all
// does not show either.
func visibleFlags(flags []*kong.Flag) []*kong.Flag {
	var out []*kong.Flag
	for _, f := range flags {
		if f.Hidden || cli.IsHelpFlag(f) {
			continue
		}
		out = append(out, f)
	}
	return out
}

// signature identifies a flag by everything the reference shows of it.
func signature(f *kong.Flag) string {
	return strings.Join([]string{f.Name, f.Help, f.Default, strings.Join(f.Envs, ","), f.Tag.Get("nofile"), f.Tag.Get("key")}, "\x00")
}

func flagName(f *kong.Flag) string {
	name := "`--" + f.Name
	if f.Tag.Negatable != "" {
		name = "`--[no-]" + f.Name
	}
	if f.PlaceHolder != "" && !f.IsBool() && !f.IsCounter() {
		name += "=" + f.PlaceHolder
	}
	name += "`"
	if f.Short != 0 {
		name = fmt.Sprintf("`-%c`, %s", f.Short, name)
	}
	return name
}

func envCell(f *kong.Flag) string {
	if len(f.Envs) == 0 {
		return "—"
	}
	parts := make([]string, len(f.Envs))
	for i, e := range f.Envs {
		parts[i] = "`" + e + "`"
	}
	return strings.Join(parts, ", ")
}

// keyCell is the flag's key in the --config file (cli.FileKey), "—" for none.
func keyCell(f *kong.Flag) string {
	if k := cli.FileKey(f); k != "" {
		return "`" + k + "`"
	}
	return "—"
}

func defaultCell(f *kong.Flag) string {
	switch {
	case f.Required:
		return "**required**"
	case f.Default == "" && f.IsBool():
		return "`false`"
	case f.Default == "":
		return "—"
	}
	return "`" + f.Default + "`"
}

func helpText(f *kong.Flag) string {
	h := refLine(f.Help)
	if f.Enum != "" && !strings.Contains(h, "One of") {
		vals := strings.Split(f.Enum, ",")
		for i, v := range vals {
			vals[i] = "`" + strings.TrimSpace(v) + "`"
		}
		h += " One of " + strings.Join(vals, ", ") + "."
	}
	return h
}

func refLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cell escapes what would end a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// UpdateReference returns doc with the region between ReferenceBegin and
// ReferenceEnd replaced by WriteReference's output, the rest unchanged.
func UpdateReference(doc string) (string, error) {
	begin := strings.Index(doc, ReferenceBegin)
	end := strings.Index(doc, ReferenceEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("find the generated region: want a line %q and, after it, a line %q", ReferenceBegin, ReferenceEnd)
	}
	var b strings.Builder
	b.WriteString(doc[:begin+len(ReferenceBegin)])
	b.WriteString("\n\n")
	if err := WriteReference(&b); err != nil {
		return "", err
	}
	b.WriteString(doc[end:])
	return b.String(), nil
}

// groupTitle is a group's heading in the reference: its help title without the
// colon kong's help puts after it.
func groupTitle(g *kong.Group) string { return strings.TrimSuffix(g.Title, ":") }
