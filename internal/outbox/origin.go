package outbox

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// Origin is the replication stream events were read from: the database (its
// system identifier and timeline) and the slot. Two events are the same event
// of the same stream only when their Origins, commit LSNs and Indexes match.
type Origin struct {
	SystemID string
	Timeline int32
	Slot     string
	prefix   []byte // "system:timeline:slot:", formatted once
}

// NewOrigin returns the Origin of a stream.
func NewOrigin(systemID string, timeline int32, slot string) *Origin {
	o := &Origin{SystemID: systemID, Timeline: timeline, Slot: slot}
	o.prefix = fmt.Appendf(nil, "%s:%d:%s:", systemID, timeline, slot)
	return o
}

// AppendPosition appends the source position of an event of this origin —
// "system:timeline:slot:commit_lsn:index", e.g.
// "7312345678901234567:1:cdc_relay:0/16B3F48:3" — to dst.
func (o *Origin) AppendPosition(dst []byte, commitLSN pglogrepl.LSN, index uint32) []byte {
	dst = append(dst, o.prefix...)
	dst = AppendLSN(dst, commitLSN)
	dst = append(dst, ':')
	return strconv.AppendUint(dst, uint64(index), 10)
}

// AppendLSN appends lsn as Postgres and pglogrepl.LSN.String write it
// ("16/B374D848": upper-case hex halves) to dst, without fmt: every event's
// position and commit-LSN header is one.
func AppendLSN(dst []byte, lsn pglogrepl.LSN) []byte {
	dst = appendUpperHex(dst, uint32(lsn>>32))
	dst = append(dst, '/')
	return appendUpperHex(dst, uint32(lsn))
}

func appendUpperHex(dst []byte, v uint32) []byte {
	const digits = "0123456789ABCDEF"
	var b [8]byte
	i := len(b)
	for {
		i--
		b[i] = digits[v&0xF]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

// Position is a source position read back from a message.
type Position struct {
	CommitLSN pglogrepl.LSN
	Index     uint32
}

// ParsePosition reads a position written by AppendPosition. ok is false when
// the position is well formed but of another origin; an error means it is not
// a position at all. Its one caller is internal/dedup's Decider, the only
// code that decides whether Kafka already holds an event (invariant 8): match
// records through it, never by parsing or comparing positions elsewhere.
func (o *Origin) ParsePosition(b []byte) (p Position, ok bool, err error) {
	if !bytes.HasPrefix(b, o.prefix) {
		if bytes.Count(b, []byte{':'}) != 4 {
			return Position{}, false, fmt.Errorf("source position %q: want system:timeline:slot:lsn:index", b)
		}
		return Position{}, false, nil
	}
	rest := b[len(o.prefix):]
	i := bytes.IndexByte(rest, ':')
	if i < 0 {
		return Position{}, false, fmt.Errorf("source position %q: no index after the LSN", b)
	}
	lsn, err := pglogrepl.ParseLSN(string(rest[:i]))
	if err != nil {
		return Position{}, false, fmt.Errorf("source position %q: %w", b, err)
	}
	idx, err := strconv.ParseUint(string(rest[i+1:]), 10, 32)
	if err != nil {
		return Position{}, false, fmt.Errorf("source position %q: index: %w", b, errors.Unwrap(err))
	}
	return Position{CommitLSN: lsn, Index: uint32(idx)}, true, nil
}
