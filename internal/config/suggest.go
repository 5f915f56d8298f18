package config

import "strings"

// Closest returns the known key nearest to key by edit distance, or "" when
// none is near enough to be a likely typo. Dashes and underscores count as
// the same, and a known key that ends with key ("brokers" for
// "kafka-brokers") counts as near.
func Closest(key string, known map[string]bool) string {
	cands := make(map[string]string, len(known))
	for k := range known {
		cands[k] = k
	}
	return suggest(key, cands)
}

// suggest returns the suggestion of the spelling in cands (spelling →
// what to suggest for it) nearest to word, or "" when none is near enough
// to be a likely typo: at most 2 edits, or a third of word's length. Dashes
// and underscores count as the same; a tie goes to the spelling nearer as
// written, then to a key (a suggestion with a dot) over a flag name.
func suggest(word string, cands map[string]string) string {
	norm := func(s string) string { return strings.ReplaceAll(s, "_", "-") }
	w := norm(word)
	best, bestD, bestRaw := "", -1, 0
	for spelled, sugg := range cands {
		d := levenshtein(w, norm(spelled))
		if strings.HasSuffix(norm(spelled), "-"+w) {
			d = min(d, 2)
		}
		raw := levenshtein(word, spelled)
		better := bestD < 0 || d < bestD || d == bestD && (raw < bestRaw ||
			raw == bestRaw && (strings.Contains(sugg, ".") && !strings.Contains(best, ".") ||
				strings.Contains(sugg, ".") == strings.Contains(best, ".") && sugg < best))
		if better {
			best, bestD, bestRaw = sugg, d, raw
		}
	}
	if bestD < 0 || bestD > max(2, len(word)/3) {
		return ""
	}
	return best
}

// levenshtein is the edit distance between a and b (insertions, deletions
// and substitutions of bytes; keys and flag names are ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
