// Package deploy_test checks the monitoring files under deploy/ against the relay
// itself: the Prometheus rules parse as Prometheus parses them, the Grafana dashboard is
// well formed, every metric (and label) that a rule or a panel queries is one the relay
// exports, and every runbook link lands on a heading of docs/operations.md.
package deploy_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/cdc-relay/cdc-relay/internal/doccheck"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

const (
	alertsFile    = "prometheus/alerts.yml"
	dashboardFile = "grafana/cdc-relay.json"
	runbookFile   = "../docs/operations.md"
)

// promql parses like a stock Prometheus: no experimental functions.
var promql = parser.NewParser(parser.Options{})

// targetLabels are attached by Prometheus at scrape time, to every series.
var targetLabels = []string{"job", "instance"}

// scrapeMetrics are series Prometheus makes itself for every target, with their labels.
var scrapeMetrics = map[string][]string{"up": nil}

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.LegacyValidation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}
	return groups
}

// TestAlertRules checks alerts.yml the way Prometheus loads it (strict fields, every
// expression parsed, annotation templates parsed) and our own conventions.
func TestAlertRules(t *testing.T) {
	groups := loadRules(t)
	if len(groups.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	seen := map[string]bool{} // alert + severity
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			name := r.Alert
			if name == "" {
				t.Errorf("group %s: rule %q is not an alerting rule", g.Name, r.Record)
				continue
			}
			if _, err := promql.ParseExpr(r.Expr); err != nil {
				t.Errorf("%s: expr does not parse: %v", name, err)
			}
			if r.For <= 0 {
				t.Errorf("%s: no `for`: a single bad scrape would fire it", name)
			}
			sev := r.Labels["severity"]
			if !slices.Contains([]string{"critical", "warning", "info"}, sev) {
				t.Errorf("%s: labels.severity is %q, want critical, warning or info", name, sev)
			}
			key := name + "/" + sev
			if seen[key] {
				t.Errorf("%s: two rules with severity %s", name, sev)
			}
			seen[key] = true
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: annotations.%s is empty", name, a)
				}
			}
		}
	}
	t.Logf("%d alerting rules in %d groups", n, len(groups.Groups))
}

// exported returns every series name the relay's /metrics exposes, with the label
// names of each: the collectors of internal/metrics plus the Go and process
// collectors that "cdc-relay run" registers beside them (internal/cli). Every vector
// gets one child so that it appears in Gather.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	touchVectors(t, m)
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	names := map[string]map[string]bool{}
	add := func(name string, lbls []*dto.LabelPair, extra ...string) {
		set := names[name]
		if set == nil {
			set = map[string]bool{}
			names[name] = set
		}
		for _, l := range lbls {
			set[l.GetName()] = true
		}
		for _, l := range extra {
			set[l] = true
		}
	}
	for _, f := range families {
		name := f.GetName()
		for _, mt := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				// Classic histograms: the bare name has no samples.
				add(name+"_bucket", mt.GetLabel(), "le")
				add(name+"_sum", mt.GetLabel())
				add(name+"_count", mt.GetLabel())
			case dto.MetricType_SUMMARY:
				add(name, mt.GetLabel(), "quantile")
				add(name+"_sum", mt.GetLabel())
				add(name+"_count", mt.GetLabel())
			default:
				add(name, mt.GetLabel())
			}
		}
	}
	for name, lbls := range scrapeMetrics {
		add(name, nil, lbls...)
	}
	for _, set := range names {
		for _, l := range targetLabels {
			set[l] = true
		}
	}
	return names
}

// touchVectors creates one child in every metric vector of m, found by reflection so
// that a collector added to metrics.Metrics is covered without changing this test.
func touchVectors(t *testing.T, m *metrics.Metrics) {
	t.Helper()
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		f, field := v.Field(i), v.Type().Field(i)
		if !field.IsExported() {
			continue
		}
		if f.Kind() == reflect.Pointer && f.IsNil() {
			t.Fatalf("metrics.New left %s nil", field.Name)
		}
		get := f.MethodByName("GetMetricWithLabelValues")
		if !get.IsValid() {
			continue // a plain Counter, Gauge or Histogram: always exported
		}
		// The label count is not exported: try until the cardinality fits.
		ok := false
		for n := 0; n <= 16 && !ok; n++ {
			args := make([]reflect.Value, n)
			for j := range args {
				args[j] = reflect.ValueOf("x")
			}
			out := get.Call(args)
			ok = out[len(out)-1].IsNil()
		}
		if !ok {
			t.Fatalf("metrics.Metrics.%s: found no label count that GetMetricWithLabelValues accepts", field.Name)
		}
	}
}

// selectorUse is one metric selector in an expression.
type selectorUse struct {
	name     string
	matchers []*labels.Matcher
}

// inspectExpr parses expr and returns its selectors, and the label names the
// expression groups or matches on (by, on, ignoring).
func inspectExpr(expr string) ([]selectorUse, []string, error) {
	e, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, nil, err
	}
	var sels []selectorUse
	var grouping []string
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			name := n.Name
			var ms []*labels.Matcher
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					if name == "" && m.Type == labels.MatchEqual {
						name = m.Value
					}
					continue
				}
				ms = append(ms, m)
			}
			sels = append(sels, selectorUse{name: name, matchers: ms})
		case *parser.AggregateExpr:
			if !n.Without {
				grouping = append(grouping, n.Grouping...)
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				grouping = append(grouping, n.VectorMatching.MatchingLabels...)
				grouping = append(grouping, n.VectorMatching.Include...)
			}
		}
		return nil
	})
	return sels, grouping, nil
}

// enums are the label values the relay exports for labels with a fixed set, by
// metric/label.
var enums = map[string][]string{
	"cdc_relay_state/state":                      metrics.States,
	"cdc_relay_slot_wal_status/status":           metrics.WALStatuses,
	"cdc_relay_dead_letters_by_status/status":    metrics.DeadLetterStatuses,
	"cdc_relay_dead_letter_retries_total/result": metrics.DeadLetterRetryResults,
}

// simpleAlternation is a regexp that is a plain list of words: a|b|c.
var simpleAlternation = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// matcherValues returns the label values a positive matcher selects, for equality and
// for plain alternations; nil for anything else.
func matcherValues(m *labels.Matcher) []string {
	switch {
	case m.Type == labels.MatchEqual:
		return []string{m.Value}
	case m.Type == labels.MatchRegexp && simpleAlternation.MatchString(m.Value):
		return strings.Split(m.Value, "|")
	}
	return nil
}

// checkExpr reports every metric of expr the relay does not export, every label a
// selector or a grouping names that none of its metrics has, and every value of an
// enumerated label (state, wal_status) that the relay never exports.
func checkExpr(where, expr string, names map[string]map[string]bool, used map[string]bool) []string {
	sels, grouping, err := inspectExpr(expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: expr does not parse: %v\n%s", where, err, expr)}
	}
	var problems []string
	allLabels := map[string]bool{}
	for _, s := range sels {
		if s.name == "" {
			problems = append(problems, fmt.Sprintf("%s: a selector without a metric name", where))
			continue
		}
		used[s.name] = true
		lbls, ok := names[s.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: metric %s is not exported by the relay", where, s.name))
			continue
		}
		for l := range lbls {
			allLabels[l] = true
		}
		for _, m := range s.matchers {
			if !lbls[m.Name] {
				problems = append(problems, fmt.Sprintf("%s: %s has no label %q", where, s.name, m.Name))
			}
			if known, ok := enums[s.name+"/"+m.Name]; ok {
				for _, v := range matcherValues(m) {
					if !slices.Contains(known, v) {
						problems = append(problems, fmt.Sprintf("%s: %s{%s=%q}: %q is not one of %v", where, s.name, m.Name, m.Value, v, known))
					}
				}
			}
		}
	}
	for _, l := range grouping {
		if !allLabels[l] && !slices.Contains(targetLabels, l) {
			problems = append(problems, fmt.Sprintf("%s: groups or matches on label %q, which none of its metrics has", where, l))
		}
	}
	return problems
}

// grafanaVar matches a Grafana variable in a query: $name, ${name} or ${name:format}.
var grafanaVar = regexp.MustCompile(`\$(\{[A-Za-z0-9_]+(:[A-Za-z0-9_]+)?\}|[A-Za-z0-9_]+)`)

// expandGrafana replaces Grafana's variables with values PromQL accepts where they
// stand: durations for the interval variables, a word for the rest (only used inside
// label-matcher strings).
func expandGrafana(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		name := strings.Trim(v, "${}")
		name, _, _ = strings.Cut(name, ":")
		switch name {
		case "__rate_interval", "__interval", "__range", "__range_s", "__range_ms", "__interval_ms":
			return "5m"
		}
		return "grafana_variable"
	})
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         *int            `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("%s is not valid JSON", dashboardFile)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboard checks the dashboard's structure: unique panel ids, a PromQL expr in
// every target, the templated data source and the instance variable.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want a current one (39)", d.SchemaVersion)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs = %+v, want one prometheus data source DS_PROMETHEUS", d.Inputs)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["instance"] != "query" {
		t.Errorf("no query variable `instance`: %v", vars)
	}
	ids := map[int]string{}
	panels := allPanels(d.Panels)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	for _, p := range panels {
		if p.ID == nil {
			t.Errorf("panel %q has no id", p.Title)
			continue
		}
		if other, dup := ids[*p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", *p.ID, other, p.Title)
		}
		ids[*p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if !strings.Contains(string(p.Datasource), "${DS_PROMETHEUS}") {
			t.Errorf("panel %q: datasource %s is not ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		refs := map[string]bool{}
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %d has no expr", p.Title, i)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target %d has a missing or repeated refId %q", p.Title, i, tg.RefID)
			}
			refs[tg.RefID] = true
		}
	}
}

// labelValues matches a Grafana variable query label_values(selector, label).
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)

// TestMetricNamesExist checks every metric and label that alerts.yml and the
// dashboard query against what the relay exports.
func TestMetricNamesExist(t *testing.T) {
	names := exported(t)
	used := map[string]bool{}
	var problems []string

	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			problems = append(problems, checkExpr(alertsFile+": "+r.Alert, r.Expr, names, used)...)
		}
	}

	d := loadDashboard(t)
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			where := fmt.Sprintf("%s: panel %q target %s", dashboardFile, p.Title, tg.RefID)
			problems = append(problems, checkExpr(where, expandGrafana(tg.Expr), names, used)...)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// The query is a string or, in current Grafana, an object; definition repeats it.
		queries := []string{v.Definition}
		var obj struct {
			Query string `json:"query"`
		}
		var str string
		if json.Unmarshal(v.Query, &obj) == nil {
			queries = append(queries, obj.Query)
		} else if json.Unmarshal(v.Query, &str) == nil {
			queries = append(queries, str)
		}
		where := fmt.Sprintf("%s: variable %s", dashboardFile, v.Name)
		for _, q := range queries {
			if q == "" {
				continue
			}
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				problems = append(problems, fmt.Sprintf("%s: query %q is not label_values(metric, label)", where, q))
				continue
			}
			problems = append(problems, checkExpr(where, expandGrafana(m[1]), names, used)...)
			if sels, _, err := inspectExpr(expandGrafana(m[1])); err == nil {
				for _, s := range sels {
					if lbls := names[s.name]; lbls != nil && !lbls[m[2]] {
						problems = append(problems, fmt.Sprintf("%s: %s has no label %q", where, s.name, m[2]))
					}
				}
			}
		}
	}

	sort.Strings(problems)
	problems = slices.Compact(problems)
	for _, p := range problems {
		t.Error(p)
	}
	list := make([]string, 0, len(used))
	for n := range used {
		list = append(list, n)
	}
	sort.Strings(list)
	t.Logf("metrics queried (%d): %s", len(list), strings.Join(list, " "))
}

// TestDashboardCoversEnums checks that the dashboard's state panels encode every
// relay state and every wal_status the relay exports, so a new one does not show up
// as "unknown".
func TestDashboardCoversEnums(t *testing.T) {
	d := loadDashboard(t)
	seen := map[string]map[string]bool{}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			sels, _, err := inspectExpr(expandGrafana(tg.Expr))
			if err != nil {
				continue // reported by TestMetricNamesExist
			}
			for _, s := range sels {
				for _, m := range s.matchers {
					key := s.name + "/" + m.Name
					if _, ok := enums[key]; !ok {
						continue
					}
					if seen[key] == nil {
						seen[key] = map[string]bool{}
					}
					for _, v := range matcherValues(m) {
						seen[key][v] = true
					}
				}
			}
		}
	}
	for key, values := range enums {
		for _, v := range values {
			if !seen[key][v] {
				t.Errorf("no dashboard panel selects %s=%q", key, v)
			}
		}
	}
}

// TestAlertRuleUnitTests runs the rule unit tests of alerts_test.yml when promtool is
// installed.
func TestAlertRuleUnitTests(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed; run `promtool test rules deploy/prometheus/alerts_test.yml`")
	}
	out, err := exec.Command(promtool, "test", "rules", "prometheus/alerts_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestRunbookAnchors checks that every runbook_url points into docs/operations.md at
// a heading that exists, and that every alert has one.
func TestRunbookAnchors(t *testing.T) {
	anchors := headingAnchors(t, runbookFile)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			raw := r.Annotations["runbook_url"]
			u, err := url.Parse(raw)
			if err != nil {
				t.Errorf("%s: runbook_url %q: %v", r.Alert, raw, err)
				continue
			}
			if !strings.HasSuffix(u.Path, "docs/operations.md") {
				t.Errorf("%s: runbook_url %q does not point to docs/operations.md", r.Alert, raw)
			}
			if u.Fragment == "" {
				t.Errorf("%s: runbook_url %q has no #anchor", r.Alert, raw)
			} else if !anchors[u.Fragment] {
				t.Errorf("%s: runbook_url anchor #%s is not a heading of %s", r.Alert, u.Fragment, runbookFile)
			}
			// The convention: an alert's section is headed by its name.
			if want := doccheck.GithubSlug(r.Alert); u.Fragment != want {
				t.Errorf("%s: runbook_url anchor is #%s, want #%s (a heading named after the alert)", r.Alert, u.Fragment, want)
			}
		}
	}
}

// TestRunbookLinks checks the links within docs/operations.md to its own sections.
func TestRunbookLinks(t *testing.T) {
	anchors := headingAnchors(t, runbookFile)
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range localLink.FindAllStringSubmatch(string(b), -1) {
		if !anchors[m[1]] {
			t.Errorf("%s links to #%s, which is not one of its headings", runbookFile, m[1])
		}
	}
}

var localLink = regexp.MustCompile(`\]\(#([^)\s]+)\)`)

// headingAnchors returns the anchors GitHub generates for file's headings
// (doccheck.HeadingAnchors, which the Markdown link test uses too).
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	anchors, err := doccheck.HeadingAnchors(file)
	if err != nil {
		t.Fatal(err)
	}
	return anchors
}

func TestGithubSlug(t *testing.T) {
	for in, want := range map[string]string{
		"CdcRelayDown":                      "cdcrelaydown",
		"Relay down, WAL grows: what to do": "relay-down-wal-grows-what-to-do",
		"`cdc-relay dlq` (dead letters)":    "cdc-relay-dlq-dead-letters",
	} {
		if got := doccheck.GithubSlug(in); got != want {
			t.Errorf("GithubSlug(%q) = %q, want %q", in, got, want)
		}
	}
}
