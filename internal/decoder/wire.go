package decoder

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Reading the pgoutput byte layout. All integers are big-endian; a String is
// NUL-terminated. The formats are described in the PostgreSQL documentation,
// "Logical Replication Message Formats".

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// pgEpochUnix is 2000-01-01 00:00:00 UTC, the PostgreSQL epoch, in Unix seconds.
const pgEpochUnix = 946684800

// pgTime converts a TimestampTz (microseconds since the PostgreSQL epoch) to UTC time.
func pgTime(us int64) time.Time {
	return time.Unix(pgEpochUnix+us/1e6, us%1e6*1e3).UTC()
}

func lengthError(want, got int) error {
	return fmt.Errorf("body is %d bytes, want %d", got, want)
}

var errTruncated = errors.New("message truncated")

// reader reads fields from a message body. The first failure sticks in err and
// makes every later read return zero values, so callers check err once.
type reader struct {
	b   []byte
	p   int
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n > len(r.b)-r.p {
		r.err = fmt.Errorf("%w: need %d bytes at offset %d, have %d", errTruncated, n, r.p, len(r.b)-r.p)
		return false
	}
	return true
}

func (r *reader) skip(n int) {
	if r.need(n) {
		r.p += n
	}
}

func (r *reader) uint8() uint8 {
	if !r.need(1) {
		return 0
	}
	r.p++
	return r.b[r.p-1]
}

func (r *reader) uint16() uint16 {
	if !r.need(2) {
		return 0
	}
	r.p += 2
	return be16(r.b[r.p-2:])
}

func (r *reader) uint32() uint32 {
	if !r.need(4) {
		return 0
	}
	r.p += 4
	return be32(r.b[r.p-4:])
}

// cstring returns a NUL-terminated string without the NUL, aliasing the body.
func (r *reader) cstring() []byte {
	if r.err != nil {
		return nil
	}
	i := bytes.IndexByte(r.b[r.p:], 0)
	if i < 0 {
		r.err = fmt.Errorf("%w: unterminated string at offset %d", errTruncated, r.p)
		return nil
	}
	s := r.b[r.p : r.p+i]
	r.p += i + 1
	return s
}

// tuple skips a TupleData: Int16 column count, then per column a kind byte ('n'
// NULL, 'u' unchanged TOAST, 't' text or 'b' binary) and, for 't' and 'b', Int32
// length and the value.
func (r *reader) tuple() {
	ncols := int(r.uint16())
	for i := 0; i < ncols && r.err == nil; i++ {
		switch kind := r.uint8(); kind {
		case 'n', 'u':
		case 't', 'b':
			n := r.uint32()
			if r.err == nil && uint64(n) > uint64(len(r.b)-r.p) {
				r.err = fmt.Errorf("%w: column %d: length %d, %d bytes left", errTruncated, i, n, len(r.b)-r.p)
			}
			r.skip(int(n))
		default:
			if r.err == nil {
				r.err = fmt.Errorf("column %d has unknown value kind %q", i, kind)
			}
		}
	}
}

// end reports the first read error, or an error if bytes are left over.
func (r *reader) end() error {
	if r.err != nil {
		return r.err
	}
	if r.p != len(r.b) {
		return fmt.Errorf("%d trailing bytes", len(r.b)-r.p)
	}
	return nil
}

// The messages below carry nothing for the relay; they are checked for
// well-formedness and skipped.

// skipUpdate checks Update: Int32 relation id, optionally 'K' or 'O' and the old
// tuple, then 'N' and the new tuple.
func skipUpdate(b []byte) error {
	r := reader{b: b}
	r.skip(4)
	t := r.uint8()
	if r.err == nil && (t == 'K' || t == 'O') {
		r.tuple()
		t = r.uint8()
	}
	if r.err == nil && t != 'N' {
		return fmt.Errorf("tuple type %q, want 'N'", t)
	}
	r.tuple()
	return r.end()
}

// skipDelete checks Delete: Int32 relation id, 'K' or 'O', the old tuple.
func skipDelete(b []byte) error {
	r := reader{b: b}
	r.skip(4)
	if t := r.uint8(); r.err == nil && t != 'K' && t != 'O' {
		return fmt.Errorf("tuple type %q, want 'K' or 'O'", t)
	}
	r.tuple()
	return r.end()
}

// skipTruncate checks Truncate: Int32 relation count, Int8 options, the relation ids.
func skipTruncate(b []byte) error {
	r := reader{b: b}
	n := r.uint32()
	r.skip(1)
	if r.err == nil && uint64(n)*4 != uint64(len(b)-r.p) {
		return fmt.Errorf("%d relations need %d bytes of ids, have %d", n, uint64(n)*4, len(b)-r.p)
	}
	return r.err
}

// skipType checks Type: Int32 type oid, String namespace, String name.
func skipType(b []byte) error {
	r := reader{b: b}
	r.skip(4)
	r.cstring()
	r.cstring()
	return r.end()
}

// skipOrigin checks Origin: Int64 origin commit LSN, String origin name.
func skipOrigin(b []byte) error {
	r := reader{b: b}
	r.skip(8)
	r.cstring()
	return r.end()
}

// skipLogicalMessage checks a logical decoding Message: Int8 flags, Int64 LSN,
// String prefix, Int32 length, the content.
func skipLogicalMessage(b []byte) error {
	r := reader{b: b}
	r.skip(9)
	r.cstring()
	n := r.uint32()
	if r.err == nil && uint64(n) != uint64(len(b)-r.p) {
		return fmt.Errorf("content length %d, %d bytes left", n, len(b)-r.p)
	}
	return r.err
}
