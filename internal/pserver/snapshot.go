package pserver

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Snapshots are stored in the run's key-value bucket as parts of at most
// snapshotPart bytes under "snap.<shard>.<gen>.<i>", then a manifest under
// "snap.<shard>" naming the generation. A reader that finds the manifest finds
// every part it names; old generations are deleted after the manifest moves.
const (
	snapshotPart   = 1 << 20
	snapshotFormat = "kpss-v3" // snapcodec.go
	// kpssV2SnapshotFormat, kpssV1SnapshotFormat and gobSnapshotFormat are
	// the formats snapshots had before: still read, so a pserver upgraded
	// in the middle of a run resumes from them.
	kpssV2SnapshotFormat = "kpss-v2"
	kpssV1SnapshotFormat = "kpss-v1"
	gobSnapshotFormat    = "gob-v1"
)

type manifest struct {
	Format string    `json:"format"`
	Gen    int64     `json:"gen"`
	Parts  int       `json:"parts"`
	Bytes  int       `json:"bytes"`
	WALSeq uint64    `json:"wal_seq"`
	Time   time.Time `json:"time"`
}

func manifestKey(shard int) string               { return fmt.Sprintf("snap.%d", shard) }
func partKey(shard int, gen int64, i int) string { return fmt.Sprintf("snap.%d.%d.%d", shard, gen, i) }

// encodeState serialises st in the snapshot's binary form; the caller holds
// the state's lock.
func encodeState(st *State) ([]byte, uint64, error) {
	b, err := appendState(nil, st)
	if err != nil {
		return nil, 0, err
	}
	return b, st.WALSeq, nil
}

// decodeState is the inverse of encodeState. It also reads the earlier
// versions of the binary form and the gob form of snapshots written before
// it (gob matches fields by name, promoted ones included: the statistics
// fields of an earlier Model land in today's Model.Summary).
func decodeState(data []byte, window int) (*State, error) {
	if bytes.HasPrefix(data, []byte(snapMagic)) {
		return readState(data, window)
	}
	st := NewState(window)
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(st); err != nil {
		return nil, fmt.Errorf("decode state snapshot: %w", err)
	}
	if st.Agg == nil {
		st.Agg = NewAggregates(window)
	}
	st.Agg.Window = window
	if st.Models == nil {
		st.Models = map[string]*Model{}
	}
	if st.LastSeq == nil {
		st.LastSeq = map[DetectorID]uint64{}
	}
	if st.Incarnation == nil {
		st.Incarnation = map[DetectorID]uint64{}
	}
	if st.Past == nil {
		st.Past = map[DetectorID][]PastIncarnation{}
	}
	if st.Counters == nil {
		st.Counters = map[string]*stats.Moments{}
	}
	st.Agg.fill()
	return st, nil
}

// saveSnapshot stores data as the shard's snapshot. With a log (onlyNewer) it
// keeps a stored snapshot that covers more of the log, so instances sharing a
// shard never move it backwards; it reports whether it wrote.
func saveSnapshot(ctx context.Context, kv jetstream.KeyValue, shard int, data []byte, walSeq uint64, onlyNewer bool) (bool, error) {
	var prev *manifest
	var rev uint64
	if e, err := kv.Get(ctx, manifestKey(shard)); err == nil {
		var m manifest
		if err := json.Unmarshal(e.Value(), &m); err == nil {
			prev = &m
		}
		rev = e.Revision()
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, fmt.Errorf("read snapshot manifest: %w", err)
	}
	if onlyNewer && prev != nil && prev.WALSeq > walSeq {
		return false, nil
	}
	m := manifest{Format: snapshotFormat, Gen: time.Now().UnixNano(), Bytes: len(data), WALSeq: walSeq, Time: time.Now().UTC()}
	if prev != nil && m.Gen <= prev.Gen {
		m.Gen = prev.Gen + 1
	}
	for off := 0; off < len(data) || m.Parts == 0; off += snapshotPart {
		end := min(off+snapshotPart, len(data))
		if _, err := kv.Put(ctx, partKey(shard, m.Gen, m.Parts), data[off:end]); err != nil {
			return false, fmt.Errorf("write snapshot part %d: %w", m.Parts, err)
		}
		m.Parts++
	}
	mb, _ := json.Marshal(m)
	var err error
	if rev == 0 {
		_, err = kv.Create(ctx, manifestKey(shard), mb)
	} else {
		_, err = kv.Update(ctx, manifestKey(shard), mb, rev)
	}
	if err != nil {
		for i := range m.Parts {
			_ = kv.Purge(ctx, partKey(shard, m.Gen, i))
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil // another instance of the shard wrote first
		}
		return false, fmt.Errorf("write snapshot manifest: %w", err)
	}
	if prev != nil {
		for i := range prev.Parts {
			_ = kv.Purge(ctx, partKey(shard, prev.Gen, i))
		}
	}
	return true, nil
}

// loadSnapshot reads the shard's snapshot; nil when there is none.
func loadSnapshot(ctx context.Context, kv jetstream.KeyValue, shard, window int) (*State, error) {
	e, err := kv.Get(ctx, manifestKey(shard))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return nil, fmt.Errorf("snapshot manifest %s: %w", manifestKey(shard), err)
	}
	if m.Format != snapshotFormat && m.Format != kpssV2SnapshotFormat && m.Format != kpssV1SnapshotFormat && m.Format != gobSnapshotFormat {
		return nil, fmt.Errorf("snapshot manifest %s: format %q is none of %q, %q, %q and %q: written by a newer pserver?", manifestKey(shard), m.Format, snapshotFormat, kpssV2SnapshotFormat, kpssV1SnapshotFormat, gobSnapshotFormat)
	}
	data := make([]byte, 0, m.Bytes)
	for i := range m.Parts {
		pe, err := kv.Get(ctx, partKey(shard, m.Gen, i))
		if err != nil {
			return nil, fmt.Errorf("read snapshot part %d of %d: %w", i, m.Parts, err)
		}
		data = append(data, pe.Value()...)
	}
	if len(data) != m.Bytes {
		return nil, fmt.Errorf("snapshot of shard %d: %d bytes read, manifest says %d", shard, len(data), m.Bytes)
	}
	st, err := decodeState(data, window)
	if err != nil {
		return nil, err
	}
	st.WALSeq = m.WALSeq
	return st, nil
}
