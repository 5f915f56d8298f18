package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSetupListsWhatCIInstalls: README's set-up line names every Debian
// package .ci/run installs when missing, so a machine set up by hand runs
// what CI runs (promtool's alert tests, curl's Postgres downloads).
func TestSetupListsWhatCIInstalls(t *testing.T) {
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	setup := regexp.MustCompile("(?s)`apt-get install ([^`]*)`").FindSubmatch(readme)
	if setup == nil {
		t.Fatal("README.md has no `apt-get install …` set-up line")
	}
	listed := strings.Fields(string(setup[1]))
	var packages []string
	for _, m := range regexp.MustCompile(`missing\+=\(([^)]*)\)`).FindAllSubmatch(ci, -1) {
		packages = append(packages, strings.Fields(string(m[1]))...)
	}
	if len(packages) < 5 {
		t.Fatalf("found only %v in .ci/run's missing+=(…) lines", packages)
	}
	for _, p := range packages {
		found := false
		for _, l := range listed {
			found = found || l == p
		}
		if !found {
			t.Errorf("README.md's set-up (apt-get install %s) lacks %s, which .ci/run installs", strings.Join(listed, " "), p)
		}
	}
}

// TestMakeTestSaysWhatItDoes: make test prints what it is doing before the
// minutes of compiling in which its packages print nothing.
func TestMakeTestSaysWhatItDoes(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := regexp.MustCompile(`(?m)^test:\n((?:\t.*\n)+)`).FindSubmatch(mk)
	if recipe == nil {
		t.Fatal("Makefile has no test: target")
	}
	first := strings.SplitN(string(recipe[1]), "\n", 2)[0]
	if !strings.Contains(first, "echo") || !strings.Contains(first, "compil") {
		t.Errorf("make test's first line %q does not say that it is compiling", first)
	}
}
