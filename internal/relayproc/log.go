package relayproc

import (
	"strconv"
	"sync"
)

// Log is an io.Writer that keeps the newest bytes written to it, up to a
// limit, starting at a line boundary once it dropped something. It is safe
// for concurrent use.
type Log struct {
	mu      sync.Mutex
	limit   int
	buf     []byte
	dropped int64
}

// NewLog returns a Log that keeps the newest limit bytes (DefaultLogLimit
// when limit <= 0).
func NewLog(limit int) *Log {
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	return &Log{limit: limit}
}

// Write appends b, dropping the oldest bytes beyond the limit.
func (l *Log) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	if over := len(l.buf) - l.limit; over > 0 {
		// Drop whole lines: at least over bytes, up to the next newline.
		cut := over
		for cut < len(l.buf) && l.buf[cut-1] != '\n' {
			cut++
		}
		l.dropped += int64(cut)
		l.buf = append(l.buf[:0], l.buf[cut:]...)
	}
	return len(b), nil
}

// String returns what the log holds, after a line saying how many bytes were
// dropped, if any were.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped == 0 {
		return string(l.buf)
	}
	return "----- " + strconv.FormatInt(l.dropped, 10) + " earlier bytes dropped -----\n" + string(l.buf)
}

// Dropped returns how many bytes were dropped so far.
func (l *Log) Dropped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}
