package route

// Topic regexes are Go's RE2 syntax. Debezium's route.topic.regex is Java's,
// which is mostly the same language; where the two part, a regex is refused
// with the construct named, rather than read in a way Java would not: RE2
// lacks lookarounds, backreferences, atomic groups and possessive
// quantifiers, and some constructs both accept mean different things.

import (
	"fmt"
	"regexp"
	"strings"
)

// CheckRegex returns an error when pattern is not a regex NewWithRegex
// accepts, naming what is wrong.
func CheckRegex(pattern string) error {
	_, err := compileRegex(pattern)
	return err
}

// compileRegex compiles pattern to match a whole value.
func compileRegex(pattern string) (*regexp.Regexp, error) {
	if why := javaOnly(pattern); why != "" {
		return nil, fmt.Errorf("topic regex %q: %s", pattern, why)
	}
	if _, err := regexp.Compile(pattern); err != nil {
		return nil, fmt.Errorf("topic regex %q: %w (the syntax is Go's RE2: no lookarounds, backreferences, atomic groups or possessive quantifiers)", pattern, err)
	}
	// Anchored at both ends, so it matches only the whole value, as Java's
	// Matcher.matches (Kafka Connect's RegexRouter) does.
	re, err := regexp.Compile(`\A(?:` + pattern + `)\z`)
	if err != nil {
		return nil, fmt.Errorf("topic regex %q: %w", pattern, err)
	}
	return re, nil
}

// javaOnly returns why pattern uses a construct that RE2 lacks or reads
// otherwise than Java, or "" when it uses none.
func javaOnly(p string) string {
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '\\' {
			if i+1 >= len(p) {
				return "" // a trailing backslash: RE2 says so
			}
			e := p[i+1]
			switch {
			case e == 'Q': // literal up to \E, in both
				end := strings.Index(p[i+2:], `\E`)
				if end < 0 {
					return ""
				}
				i += 2 + end + 1
				continue
			case e >= '1' && e <= '9' && !inClass, e == 'k' && i+2 < len(p) && p[i+2] == '<':
				return fmt.Sprintf("%q is a backreference, which Go's RE2 does not have", p[i:min(i+3, len(p))])
			case e == '0':
				return `\0 is Java's octal escape, which RE2 reads otherwise: write \x{hh} instead`
			case e == 'v':
				return `\v is vertical whitespace in Java but only the vertical tab in RE2: write [\n\x0B\f\r] instead`
			case e == 'u':
				return `\u is Java's escape for a UTF-16 unit: write \x{hhhh} instead`
			case strings.IndexByte("ZGRXhHVec", e) >= 0:
				return fmt.Sprintf(`\%c is Java's, which Go's RE2 does not have`, e)
			}
			i++
			continue
		}
		if inClass {
			switch {
			case c == ']':
				inClass = false
			case c == '[':
				return "a '[' inside a character class is a nested class in Java and a literal in RE2 (and [[:alpha:]] is RE2's only): escape it as \\["
			case c == '&' && i+1 < len(p) && p[i+1] == '&':
				return "'&&' in a character class is an intersection in Java and literal text in RE2"
			}
			continue
		}
		switch c {
		case '[':
			inClass = true
			// A ']' right after '[' or '[^' is literal in both.
			if i+1 < len(p) && p[i+1] == '^' {
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				i++
			}
		case '(':
			if i+1 >= len(p) || p[i+1] != '?' {
				continue
			}
			rest := p[i+2:]
			switch {
			case strings.HasPrefix(rest, "="), strings.HasPrefix(rest, "!"), strings.HasPrefix(rest, "<="), strings.HasPrefix(rest, "<!"):
				return fmt.Sprintf("%q is a lookaround, which Go's RE2 does not have", p[i:min(i+4, len(p))])
			case strings.HasPrefix(rest, ">"):
				return "(?> is an atomic group, which Go's RE2 does not have"
			case strings.HasPrefix(rest, "<"), strings.HasPrefix(rest, "P<"):
				continue // a named group, (?<name>…), in both
			}
			for _, f := range rest {
				if f == ')' || f == ':' {
					break
				}
				switch f {
				case 'U':
					return "flag U is UNICODE_CHARACTER_CLASS in Java but makes quantifiers lazy in RE2"
				case 'd', 'u', 'x', 'c':
					return fmt.Sprintf("flag %c is Java's, which Go's RE2 does not have", f)
				}
			}
		case '*', '+', '?':
			if i+1 < len(p) && p[i+1] == '+' {
				return fmt.Sprintf("%q is a possessive quantifier, which Go's RE2 does not have", p[i:i+2])
			}
		}
	}
	return ""
}
