package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// fileFormat is the version written in FileStore files.
const fileFormat = 1

// fileDoc is the JSON document of a FileStore file.
type fileDoc struct {
	Version     int                  `json:"version"`
	Checkpoints map[string]fileEntry `json:"checkpoints"` // by slot name
}

// fileEntry is one checkpoint in a FileStore file. The LSN is in Postgres' text form
// so that operators can read and compare it with pg_replication_slots.
type fileEntry struct {
	SystemID  string    `json:"system_id"`
	LSN       string    `json:"lsn"`
	UpdatedAt time.Time `json:"updated_at"`
	RelayName string    `json:"relay_name"`
	// CommitTime is Checkpoint.CommitTime; absent when unknown.
	CommitTime *time.Time `json:"commit_time,omitempty"`
	// KafkaOffsets is Checkpoint.Offsets; absent when none are stored (files
	// of older relays lack it), {} when stored but empty.
	KafkaOffsets *Offsets `json:"kafka_offsets,omitempty"`
	// OldestUnrelayedAt is Checkpoint.OldestUnrelayed; absent when none waited.
	OldestUnrelayedAt *time.Time `json:"oldest_unrelayed_at,omitempty"`
	// OutboxTables is Checkpoint.Tables; absent when unknown.
	OutboxTables *[]string `json:"outbox_tables,omitempty"`
	// PendingJoins is Checkpoint.Joins; absent when none.
	PendingJoins []Join `json:"pending_joins,omitempty"`
}

// FileStore keeps checkpoints in a local JSON file, one entry per slot. Every Save
// replaces the file atomically: it writes a temporary file in the same directory,
// syncs it, renames it over the old one and syncs the directory, so a crash leaves
// either the old or the new file, never a torn one.
//
// A FileStore serialises its own calls; two processes must not share one file.
type FileStore struct {
	path string
	mu   sync.Mutex
}

// NewFileStore returns a store using the file at path. The file need not exist; its
// directory must, when Save is called.
func NewFileStore(path string) *FileStore {
	return &FileStore{path: path}
}

// Ensure returns nil: a file store has nothing to create before its first Load
// (a missing file is an empty store; Save writes it). It makes FileStore a
// store the relay prepares like a TableStore.
func (s *FileStore) Ensure(context.Context) error { return nil }

// Load returns the checkpoint of slot, and false if the file or the entry does not
// exist. A file that cannot be parsed is an error naming it, never an empty store.
func (s *FileStore) Load(_ context.Context, slot string) (Checkpoint, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	doc, err := s.read()
	if err != nil {
		return Checkpoint{}, false, err
	}
	e, ok := doc.Checkpoints[slot]
	if !ok {
		return Checkpoint{}, false, nil
	}
	lsn, err := pglogrepl.ParseLSN(e.LSN)
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("parse LSN %q of slot %q in checkpoint file %s: %w", e.LSN, slot, s.path, err)
	}
	c := Checkpoint{Slot: slot, SystemID: e.SystemID, LSN: lsn, UpdatedAt: e.UpdatedAt, RelayName: e.RelayName}
	if e.CommitTime != nil {
		c.CommitTime = *e.CommitTime
	}
	if e.KafkaOffsets != nil {
		c.Offsets = *e.KafkaOffsets
	}
	if e.OldestUnrelayedAt != nil {
		c.OldestUnrelayed = *e.OldestUnrelayedAt
	}
	if e.OutboxTables != nil {
		c.Tables = append([]string{}, *e.OutboxTables...)
	}
	c.Joins = CloneJoins(e.PendingJoins)
	return c, true, nil
}

// Save inserts or replaces the checkpoint of c.Slot but for its Joins, which
// it leaves as stored, keeping the other slots' entries.
// A zero c.UpdatedAt is stored as the current time. If the existing file cannot be
// parsed, Save fails rather than overwrite it.
func (s *FileStore) Save(_ context.Context, c Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	doc, err := s.read()
	if err != nil {
		return err
	}
	if c.UpdatedAt.IsZero() {
		c.UpdatedAt = time.Now()
	}
	e := fileEntry{
		SystemID:  c.SystemID,
		LSN:       c.LSN.String(),
		UpdatedAt: c.UpdatedAt.UTC(),
		RelayName: c.RelayName,
	}
	if !c.CommitTime.IsZero() {
		t := c.CommitTime.UTC()
		e.CommitTime = &t
	}
	if c.Offsets != nil {
		e.KafkaOffsets = &c.Offsets
	}
	if !c.OldestUnrelayed.IsZero() {
		t := c.OldestUnrelayed.UTC()
		e.OldestUnrelayedAt = &t
	}
	if c.Tables != nil {
		tables := append([]string{}, c.Tables...)
		e.OutboxTables = &tables
	}
	e.PendingJoins = doc.Checkpoints[c.Slot].PendingJoins
	doc.Checkpoints[c.Slot] = e
	if err := s.write(doc); err != nil {
		return fmt.Errorf("save checkpoint of slot %q: %w", c.Slot, err)
	}
	return nil
}

// write replaces the file with doc. Called with mu held.
func (s *FileStore) write(doc fileDoc) error {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encode checkpoint file %s: %w", s.path, err)
	}
	if err := writeFileAtomic(s.path, append(data, '\n')); err != nil {
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	return nil
}

// Close releases nothing: a FileStore holds no open file between calls.
func (s *FileStore) Close() error { return nil }

// read parses the file, returning an empty document if it does not exist.
// Called with mu held.
func (s *FileStore) read() (fileDoc, error) {
	doc := fileDoc{Version: fileFormat, Checkpoints: map[string]fileEntry{}}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return doc, nil
	}
	if err != nil {
		return fileDoc{}, fmt.Errorf("read checkpoint file %s: %w", s.path, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return fileDoc{}, fmt.Errorf("decode checkpoint file %s (fix or remove it; it is never overwritten while unreadable): %w", s.path, err)
	}
	if doc.Version != fileFormat {
		return fileDoc{}, fmt.Errorf("decode checkpoint file %s: format version %d, this relay reads %d", s.path, doc.Version, fileFormat)
	}
	if doc.Checkpoints == nil {
		doc.Checkpoints = map[string]fileEntry{}
	}
	return doc, nil
}

// writeFileAtomic replaces path with data: temp file in the same directory, fsync,
// rename, fsync of the directory. The errors name the file they are about.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file in %s: %w", dir, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp) // best effort; the error that matters is err
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("close directory %s: %w", dir, err)
	}
	return nil
}
