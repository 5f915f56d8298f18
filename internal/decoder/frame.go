package decoder

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// Boundary decodes where transactions begin and end in a pgoutput stream,
// without a Decoder's state (no relation, no outbox table): for tools that
// read a slot's changes without streaming them, such as
// replication.PeekOldestCommit. A Begin is KindBegin (XID, CommitLSN,
// CommitTime set), a Commit is KindCommit (CommitLSN, EndLSN, CommitTime
// set; XID is Begin's). Any other message of protocol version 1 (a change,
// a Relation, Type, Origin or logical decoding message) is KindSkip with no
// field set: something the transaction holds, its body unread. Errors are
// Decode's for the same bytes.
func Boundary(walData []byte) (Message, error) {
	if len(walData) == 0 {
		return Message{}, errors.New("decode pgoutput message: empty message")
	}
	typ, body := walData[0], walData[1:]
	var (
		m   Message
		err error
	)
	switch typ {
	case 'B':
		m, err = beginFields(body)
	case 'C':
		m, err = commitFields(body)
	case 'I', 'U', 'D', 'T', 'R', 'Y', 'O', 'M':
		return Message{Kind: KindSkip}, nil
	default:
		return Message{}, unsupported(typ)
	}
	if err != nil {
		return Message{}, fmt.Errorf("decode pgoutput %s message: %w", messageName(typ), err)
	}
	return m, nil
}

// beginFields decodes Begin: Int64 final LSN, Int64 commit time, Int32 xid.
func beginFields(b []byte) (Message, error) {
	if len(b) != 20 {
		return Message{}, lengthError(20, len(b))
	}
	return Message{Kind: KindBegin, CommitLSN: pglogrepl.LSN(be64(b)), CommitTime: pgTime(int64(be64(b[8:]))), XID: be32(b[16:])}, nil
}

// commitFields decodes Commit: Int8 flags, Int64 commit LSN, Int64 end LSN,
// Int64 commit time.
func commitFields(b []byte) (Message, error) {
	if len(b) != 25 {
		return Message{}, lengthError(25, len(b))
	}
	return Message{
		Kind:       KindCommit,
		CommitLSN:  pglogrepl.LSN(be64(b[1:])),
		EndLSN:     pglogrepl.LSN(be64(b[9:])),
		CommitTime: pgTime(int64(be64(b[17:]))),
	}, nil
}

// unsupported is the error of a message type protocol version 1 does not
// send: a streaming message, or an unknown type.
func unsupported(typ byte) error {
	switch typ {
	case 'S', 'E', 'c', 'A':
		return fmt.Errorf("decode pgoutput message: unexpected streaming message %q: the relay uses proto_version 1, which never streams", typ)
	}
	return fmt.Errorf("decode pgoutput message: unknown message type %q", typ)
}
