//go:build race

package decoder

// raceEnabled reports whether the race detector is on; it changes allocation counts.
const raceEnabled = true
