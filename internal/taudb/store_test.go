package taudb

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func openStore(t testing.TB) *Store {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, _, err := s.Configure(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConfigure(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok, err := s.Version(ctx); err != nil || ok {
		t.Fatalf("empty database: Version = _, %v, %v; want no schema", ok, err)
	}
	v, created, err := s.Configure(ctx)
	if err != nil || !created || v != 2 {
		t.Fatalf("Configure on empty database = %d, %v, %v; want 2, true, nil", v, created, err)
	}
	v, created, err = s.Configure(ctx)
	if err != nil || created || v != 2 {
		t.Fatalf("Configure again = %d, %v, %v; want 2, false, nil", v, created, err)
	}
	var views, params, sources, derived int
	err = s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM taudb_view WHERE name = 'All Trials'),
		(SELECT count(*) FROM taudb_view_parameter WHERE column_name = 'total_threads' AND value = '-1'),
		(SELECT count(*) FROM data_source), (SELECT count(*) FROM derived_thread_type)`).Scan(&views, &params, &sources, &derived)
	if err != nil {
		t.Fatal(err)
	}
	if views != 1 || params != 1 || sources != 21 || derived != 7 {
		t.Errorf("seeded rows: views %d params %d data sources %d derived types %d; want 1 1 21 7", views, params, sources, derived)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE schema_version SET version = 1`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Configure(ctx); err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Errorf("Configure on a version 1 schema: err = %v, want one naming version 1", err)
	}
}

// runRefQueries runs the normalising queries of testdata/taudb-ref/queries.sql
// and returns each table's header and rows.
func runRefQueries(t *testing.T, s *Store) map[string][][]string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", "taudb-ref", "queries.sql"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][][]string{}
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, part := range strings.Split(string(text), "\n-- table: ")[1:] {
		name, stmt, _ := strings.Cut(part, "\n")
		stmt = strings.TrimSpace(strings.Split(stmt, "\n-- ")[0])
		stmt = strings.TrimSuffix(stmt, ";")
		var buf bytes.Buffer
		if _, err := conn.Conn().PgConn().CopyTo(ctx, &buf, "COPY ("+stmt+`) TO STDOUT WITH (FORMAT csv, HEADER, NULL '\N')`); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		all, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = append([][]string{all[0]}, normalizeRows(all[0], all[1:])...)
	}
	return out
}

// TestStoreFixtures saves every fixture, checks the stored rows against
// TAU's loader's (testdata/taudb-ref), loads the trial back, and checks that
// it is the same trial and still writes TAU profiles.
func TestStoreFixtures(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			s := openStore(t)
			ctx := context.Background()
			tr := readFixture(t, fx.dir)
			tr.PrimaryMetadata = append(tr.PrimaryMetadata, Attribute{Name: "Application", Value: "app"}, Attribute{Name: "Experiment", Value: "exp"})
			if _, err := s.SaveTrial(ctx, tr); err != nil {
				t.Fatal(err)
			}
			if err := s.AddViews(ctx, "app", "exp"); err != nil {
				t.Fatal(err)
			}
			got := runRefQueries(t, s)
			for _, table := range append(refTables, "taudb_view", "taudb_view_parameter") {
				header, want := readRefCSV(t, fx.ref, table)
				if g := got[table]; len(g) == 0 || strings.Join(g[0], ",") != strings.Join(header, ",") {
					t.Fatalf("%s: header %v, want %v", table, g, header)
				}
				compareRows(t, table, got[table][1:], normalizeRows(header, want))
			}

			back, err := s.LoadTrial(ctx, tr.ID)
			if err != nil {
				t.Fatal(err)
			}
			want, have := dumpTrial(tr), dumpTrial(back)
			for _, table := range refTables {
				compareRows(t, "loaded "+table, have[table], want[table])
			}
			for _, idx := range DerivedIndexes {
				for _, c := range tr.Counters {
					a, b := tr.Thread(idx).CounterValueFor(c), back.Thread(idx).CounterValueFor(back.Counter(c.Name))
					if (a == nil) != (b == nil) || (a != nil && (a.Mean != b.Mean || a.SampleCount != b.SampleCount)) {
						t.Errorf("derived counter %q on thread %d: loaded %+v, want %+v", c.Name, idx, b, a)
					}
				}
			}
			// What comes back from TAUdb writes profiles that parse to the same data.
			dir := t.TempDir()
			if err := WriteDir(dir, back); err != nil {
				t.Fatal(err)
			}
			again, err := ReadDir(dir, tr.Name)
			if err != nil {
				t.Fatalf("re-read exported profiles: %v", err)
			}
			w, h := dumpTrial(tr), dumpTrial(again)
			for _, table := range []string{"timer", "timer_group", "timer_callpath", "timer_call_data", "timer_value", "counter_value", "secondary_metadata"} {
				compareRows(t, "exported "+table, h[table], w[table])
			}
		})
	}
}

func TestTrialsFilter(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	a := readFixture(t, "hatchet-tau-cpi-mpi")
	c := readFixture(t, "tau2-taudb-c-api-parse-test")
	for _, tr := range []*Trial{a, c} {
		if _, err := s.SaveTrial(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		f    Filter
		want []int
	}{
		{"all", Filter{}, []int{a.ID, c.ID}},
		{"by id", Filter{ID: c.ID}, []int{c.ID}},
		{"by name", Filter{Name: "hatchet-tau-cpi-mpi"}, []int{a.ID}},
		{"by primary metadata", Filter{Metadata: map[string]string{"OS Name": "Darwin"}}, []int{c.ID}},
		{"by two keys", Filter{Metadata: map[string]string{"OS Name": "Linux", "CPU Cores": "16"}}, []int{a.ID}},
		{"no match", Filter{Name: "nope"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Trials(ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []int
			for _, g := range got {
				ids = append(ids, g.ID)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("ids %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("ids %v, want %v", ids, tc.want)
				}
			}
		})
	}
	if _, err := s.LoadTrial(ctx, 9999); err == nil {
		t.Error("LoadTrial of a missing id: no error")
	}
}

func TestSaveRejectsForeignReferences(t *testing.T) {
	s := openStore(t)
	a := readFixture(t, "tau2-examples-wrap")
	b := readFixture(t, "tau2-taudb-c-api-parse-test")
	// A thread of a carrying call data of b's call-graph node.
	th := a.Thread(0)
	a.AddCallData(th, b.Callpaths[0]).Calls = 1
	if _, err := s.SaveTrial(context.Background(), a); err == nil || !strings.Contains(err.Error(), "refers outside the trial") {
		t.Fatalf("err = %v, want a reference error", err)
	}
	list, err := s.Trials(context.Background(), Filter{})
	if err != nil || len(list) != 0 {
		t.Errorf("a failed save left trials %v (%v)", list, err)
	}
}
