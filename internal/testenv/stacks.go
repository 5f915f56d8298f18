package testenv

import (
	"runtime"
	"strings"
)

// GoroutineStacks returns the stack of every goroutine of the process, one
// string each, starting "goroutine N [state]:". Tests that check a component
// stopped its goroutines filter them.
func GoroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Split(string(buf), "\n\n")
}
