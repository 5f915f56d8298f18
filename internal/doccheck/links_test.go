package doccheck

import (
	"bufio"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository root, relative to this package's directory.
const root = "../.."

// TestMarkdownLinks checks every relative link and anchor of every Markdown
// file in the repository.
func TestMarkdownLinks(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 5 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(files), root, files)
	}
	anchors := map[string]map[string]bool{} // file → its anchors, read once
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		a, err := HeadingAnchors(file)
		if err != nil {
			t.Fatal(err)
		}
		anchors[file] = a
		return a
	}
	checked := 0
	for _, file := range files {
		links, err := relativeLinks(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			checked++
			rel, _ := filepath.Rel(root, file)
			target := file
			if l.path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(l.path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", rel, l.line, l.raw, l.path)
					continue
				}
			}
			if l.fragment == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			if !anchorsOf(target)[l.fragment] {
				trel, _ := filepath.Rel(root, target)
				t.Errorf("%s:%d: link %q: #%s is not a heading of %s", rel, l.line, l.raw, l.fragment, trel)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
}

// markdownFiles lists the .md files under root, skipping hidden directories
// (.git).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list Markdown files: %v", err)
	}
	return files
}

type link struct {
	raw            string // as written
	path, fragment string // path "" for a link within the file
	line           int
}

var (
	// inlineLink matches [text](target) and ![alt](target), the target up
	// to a space (a title follows) or the closing parenthesis.
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef matches a reference definition: [name]: target
	refDef   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	scheme   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// relativeLinks returns the links of file that stay in the repository
// (no scheme such as https: or mailto:), outside code blocks and code spans.
func relativeLinks(file string) ([]link, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var links []link
	inFence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if isFence(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, raw := range targets {
			if scheme.MatchString(raw) || strings.HasPrefix(raw, "//") {
				continue
			}
			p, frag, _ := strings.Cut(raw, "#")
			if up, err := url.PathUnescape(p); err == nil {
				p = up
			}
			links = append(links, link{raw: raw, path: p, fragment: frag, line: n})
		}
	}
	return links, sc.Err()
}

func TestGithubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"What the measurements say (2026-12-01 and 02, this 2-core machine)": "what-the-measurements-say-2026-12-01-and-02-this-2-core-machine",
		"Automatic retries: `--dlq-auto-retry`":                              "automatic-retries---dlq-auto-retry",
		"Exporting the relay's spans (`--otel-exporter otlp`)":               "exporting-the-relays-spans---otel-exporter-otlp",
		"CdcRelayDown":                "cdcrelaydown",
		"See [the guide](x.md) first": "see-the-guide-first",
	} {
		if got := GithubSlug(heading); got != want {
			t.Errorf("GithubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestBrokenLinkIsFound runs the checks on a file with a broken link and a
// broken anchor, so a pattern that matched nothing could not pass.
func TestBrokenLinkIsFound(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.md")
	doc := "# Title\n\nSee [b](b.md), [self](#title), [gone](#nope) and `[code](c.md)`.\n\n```\n[fenced](d.md)\n```\n"
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	links, err := relativeLinks(file)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range links {
		got = append(got, l.raw)
	}
	if want := "b.md #title #nope"; strings.Join(got, " ") != want {
		t.Fatalf("links = %q, want %q", strings.Join(got, " "), want)
	}
	a, err := HeadingAnchors(file)
	if err != nil {
		t.Fatal(err)
	}
	if !a["title"] || a["nope"] {
		t.Fatalf("anchors = %v, want title and not nope", a)
	}
}
