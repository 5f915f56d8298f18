package decoder

import (
	"encoding/binary"
	"time"

	"github.com/jackc/pglogrepl"
)

// A small pgoutput (proto_version 1) encoder for byte-fixture tests, written from
// the protocol documentation, independently of the decoder.

type enc []byte

func (e enc) u8(v byte) enc      { return append(e, v) }
func (e enc) u16(v uint16) enc   { return binary.BigEndian.AppendUint16(e, v) }
func (e enc) u32(v uint32) enc   { return binary.BigEndian.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc   { return binary.BigEndian.AppendUint64(e, v) }
func (e enc) str(s string) enc   { return append(append(e, s...), 0) }
func (e enc) raw(b []byte) enc   { return append(e, b...) }
func (e enc) ts(t time.Time) enc { return e.u64(uint64(t.Sub(pgEpoch).Microseconds())) }

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func beginMsg(final pglogrepl.LSN, commit time.Time, xid uint32) []byte {
	return enc{'B'}.u64(uint64(final)).ts(commit).u32(xid)
}

func commitMsg(commitLSN, end pglogrepl.LSN, commit time.Time) []byte {
	return enc{'C'}.u8(0).u64(uint64(commitLSN)).u64(uint64(end)).ts(commit)
}

// relationMsg announces a relation whose columns are all text (oid 25).
func relationMsg(id uint32, namespace, name string, columns ...string) []byte {
	e := enc{'R'}.u32(id).str(namespace).str(name).u8('d').u16(uint16(len(columns)))
	for i, c := range columns {
		flags := byte(0)
		if i == 0 {
			flags = 1 // part of the key
		}
		e = e.u8(flags).str(c).u32(25).u32(0xffffffff)
	}
	return e
}

// col is one TupleData column.
type col struct {
	kind byte // 'n', 'u', 't' or 'b'
	data string
}

func txt(s string) col { return col{kind: 't', data: s} }
func bin(s string) col { return col{kind: 'b', data: s} }

var (
	null  = col{kind: 'n'}
	toast = col{kind: 'u'}
)

func (e enc) tuple(cols []col) enc {
	e = e.u16(uint16(len(cols)))
	for _, c := range cols {
		e = e.u8(c.kind)
		if c.kind == 't' || c.kind == 'b' {
			e = e.u32(uint32(len(c.data))).raw([]byte(c.data))
		}
	}
	return e
}

func insertMsg(rel uint32, cols ...col) []byte {
	return enc{'I'}.u32(rel).u8('N').tuple(cols)
}

// updateMsg encodes an Update; oldKind is 0 (no old tuple), 'K' or 'O'.
func updateMsg(rel uint32, oldKind byte, old, new []col) []byte {
	e := enc{'U'}.u32(rel)
	if oldKind != 0 {
		e = e.u8(oldKind).tuple(old)
	}
	return e.u8('N').tuple(new)
}

func deleteMsg(rel uint32, oldKind byte, old ...col) []byte {
	return enc{'D'}.u32(rel).u8(oldKind).tuple(old)
}

func truncateMsg(options byte, rels ...uint32) []byte {
	e := enc{'T'}.u32(uint32(len(rels))).u8(options)
	for _, r := range rels {
		e = e.u32(r)
	}
	return e
}

func typeMsg(oid uint32, namespace, name string) []byte {
	return enc{'Y'}.u32(oid).str(namespace).str(name)
}

func originMsg(lsn pglogrepl.LSN, name string) []byte {
	return enc{'O'}.u64(uint64(lsn)).str(name)
}

func logicalMsg(transactional bool, lsn pglogrepl.LSN, prefix, content string) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	return enc{'M'}.u8(flags).u64(uint64(lsn)).str(prefix).u32(uint32(len(content))).raw([]byte(content))
}
