package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// profilesIn reads every profile of the store at path.
func profilesIn(t *testing.T, s *Store) []provenance.ThreadProfile {
	t.Helper()
	var out []provenance.ThreadProfile
	if err := s.Profiles(context.Background(), func(p provenance.ThreadProfile) error {
		out = append(out, p)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The parts of a split profile are rows of their own; a store written
// before profiles had parts is given the column with its rows kept.
func TestProfileParts(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{
		`CREATE TABLE profiles (pid INTEGER NOT NULL, rid INTEGER NOT NULL, tid INTEGER NOT NULL, io_step INTEGER NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (pid, rid, tid, io_step))`,
		`INSERT INTO profiles VALUES (0, 3, 0, 7, '{"pid":0,"rank":3,"tid":0,"io_step":7,"final":true,"timers":[{"name":"main","calls":1,"subrs":0,"inclusive":5,"exclusive":5,"sumsq_inclusive":25,"sumsq_exclusive":25}],"counters":[]}')`,
	} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := profilesIn(t, s); len(got) != 1 || got[0].Rank != 3 || len(got[0].Timers) != 1 {
		t.Fatalf("the old store's profile after opening: %+v", got)
	}
	var parts []provenance.ThreadProfile
	for i := range 3 {
		parts = append(parts, provenance.ThreadProfile{Rank: 1, Step: 9, Final: true, Part: i, Parts: 3,
			Timers: []provenance.TimerProfile{{Name: "f" + string(rune('a'+i)), Calls: 1}}, Counters: []provenance.CounterProfile{}})
	}
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindProfiles, Profiles: parts}); err != nil {
		t.Fatal(err)
	}
	var got []provenance.ThreadProfile
	for _, p := range profilesIn(t, s) {
		if p.Rank == 1 {
			got = append(got, p)
		}
	}
	if len(got) != 3 {
		t.Fatalf("%d parts stored, want 3", len(got))
	}
	whole, err := provenance.Join(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Timers) != 3 {
		t.Errorf("joined profile has %d timers, want 3", len(whole.Timers))
	}
}
