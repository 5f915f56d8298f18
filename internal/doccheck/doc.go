// Package doccheck holds no code the relay uses: its test checks that every
// relative link in the repository's Markdown files (README.md, docs/,
// bench/README.md, consumer/README.md, …) names a file that exists and, with
// a #fragment into a Markdown file, a heading of that file by GitHub's
// anchor rules. It is part of `go test ./...`.
package doccheck
