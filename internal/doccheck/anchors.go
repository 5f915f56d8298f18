package doccheck

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"unicode"
)

func isFence(line string) bool {
	t := strings.TrimSpace(line)
	return strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")
}

// HeadingAnchors returns the anchors GitHub generates for file's headings
// (outside fenced code blocks), with -1, -2… for repeats, plus the ids of
// explicit <a id="…"> / <a name="…"> tags.
func HeadingAnchors(file string) (map[string]bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	anchors := map[string]bool{}
	counts := map[string]int{}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if isFence(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if len(line)-len(text) > 6 || (text != "" && text[0] != ' ') {
			continue
		}
		slug := GithubSlug(strings.TrimSpace(text))
		if n := counts[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		counts[slug]++
	}
	return anchors, nil
}

var htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// GithubSlug is GitHub's anchor for a heading: lower case, letters, digits,
// - and _ kept, spaces as hyphens, everything else (punctuation, backticks,
// emphasis) dropped. Link text in a heading counts, its target does not.
func GithubSlug(heading string) string {
	heading = headingLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

var headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
