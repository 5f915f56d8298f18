// Package doccheck holds no code the relay uses: its test checks that every
// relative link in the repository's Markdown files (README.md, docs/,
// bench/README.md, consumer/README.md, …) names a file that exists and, with
// a #fragment into a Markdown file, a heading of that file by GitHub's
// anchor rules. It is part of `go test ./...`. HeadingAnchors and GithubSlug,
// GitHub's anchors of a Markdown file, serve the other tests that check links
// (deploy's runbook links).
package doccheck
