package tauexport

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// solveCalls is how many times thread (pid, rank, tid) of the two-program run
// called solve: a different number for every thread, so that a thread read
// in another's place shows.
func solveCalls(pid, rank, tid uint32) uint64 {
	return 1 + uint64(pid)*100 + uint64(rank)*10 + uint64(tid)
}

// twoPrograms writes to a fresh store what two programs (pid 0 and 1) with
// the same ranks (0, 1) and threads (0, 1) publish: an early snapshot and a
// final profile per thread, and each program's executable for all its
// threads.
func twoPrograms(t *testing.T) *sqlitestore.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "provenance.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var prof []provenance.ThreadProfile
	var meta []provenance.Metadata
	for pid := uint32(0); pid < 2; pid++ {
		for r := uint32(0); r < 2; r++ {
			for tid := uint32(0); tid < 2; tid++ {
				n := solveCalls(pid, r, tid)
				final := provenance.ThreadProfile{PID: pid, Rank: r, TID: tid, Step: 20, Final: true, Timers: []provenance.TimerProfile{
					{Name: "main", Calls: 1, Subrs: n, Inclusive: 1000, Exclusive: 100},
					{Name: "solve", Calls: n, Inclusive: 900, Exclusive: 900},
					{Name: "main => solve", Calls: n, Inclusive: 900, Exclusive: 900},
				}}
				snap := final
				snap.Step, snap.Final = 10, false
				snap.Timers = []provenance.TimerProfile{{Name: "main", Calls: 1, Inclusive: 1, Exclusive: 1}}
				prof = append(prof, snap, final)
			}
		}
		// Rank 9 has no profile: the entry applies to every thread of
		// its program, and only of its program.
		meta = append(meta, provenance.Metadata{Descr: "Executable", PID: pid, RID: 9, Value: fmt.Sprintf("/bin/prog%d", pid)})
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindProfiles, Profiles: prof}); err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindMetadata, Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	return st
}

// twoProgramFiles are the TAU files of the two-program run: node = rank,
// context = program, thread.
func twoProgramFiles() []string {
	var want []string
	for r := 0; r < 2; r++ {
		for pid := 0; pid < 2; pid++ {
			for tid := 0; tid < 2; tid++ {
				want = append(want, fmt.Sprintf("profile.%d.%d.%d", r, pid, tid))
			}
		}
	}
	return want
}

// TestTwoProgramsStayApartInProfiles writes the trial of two programs that
// share rank and thread numbers, read from the store, and checks in the TAU
// files, read as text, that each program's threads are its own: eight
// files, each with its thread's solve count and its program's executable.
func TestTwoProgramsStayApartInProfiles(t *testing.T) {
	ctx := context.Background()
	tr, err := ReadTrial(ctx, twoPrograms(t), "two programs")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Write(ctx, tr, Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	want := twoProgramFiles()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("profile files %v, want %v (node = rank, context = program, thread)", got, want)
	}
	for _, name := range want {
		var r, pid, tid uint32
		if _, err := fmt.Sscanf(name, "profile.%d.%d.%d", &r, &pid, &tid); err != nil {
			t.Fatal(err)
		}
		calls, meta := readSolveCalls(t, filepath.Join(dir, name))
		if want := solveCalls(pid, r, tid); calls != want {
			t.Errorf("%s: solve called %d times, want %d (program %d rank %d thread %d's own final profile)", name, calls, want, pid, r, tid)
		}
		if want := fmt.Sprintf("<name>Executable</name><value>/bin/prog%d</value>", pid); !strings.Contains(meta, want) {
			t.Errorf("%s: metadata lacks %s", name, want)
		}
	}

}

// TestTwoProgramsStayApartInTAUdb saves the two-program trial to TAUdb and
// checks by SQL on TAUdb's tables that it has eight threads, (rank, program,
// thread), each with its own solve count.
func TestTwoProgramsStayApartInTAUdb(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	tr, err := ReadTrial(ctx, twoPrograms(t), "two programs")
	if err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, tr, Options{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	want := twoProgramFiles()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT h.node_rank, h.context_rank, h.thread_rank, d.calls
		FROM thread h
		JOIN timer_call_data d ON d.thread = h.id
		JOIN timer_callpath cp ON d.timer_callpath = cp.id
		JOIN timer tm ON cp.timer = tm.id
		WHERE h.trial = $1 AND h.node_rank >= 0 AND tm.name = 'solve' AND cp.parent IS NULL
		ORDER BY 1, 2, 3`, id)
	if err != nil {
		t.Fatal(err)
	}
	var threads []string
	for rows.Next() {
		var r, pid, tid int
		var calls int
		if err := rows.Scan(&r, &pid, &tid, &calls); err != nil {
			t.Fatal(err)
		}
		threads = append(threads, fmt.Sprintf("profile.%d.%d.%d", r, pid, tid))
		if want := solveCalls(uint32(pid), uint32(r), uint32(tid)); calls != int(want) {
			t.Errorf("TAUdb thread %d,%d,%d: solve called %v times, want %d", r, pid, tid, calls, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(threads, want) {
		t.Errorf("TAUdb threads with solve %v, want %v", threads, want)
	}
	var total, contexts int
	if err := conn.QueryRow(ctx, `SELECT total_threads, contexts_per_node FROM trial WHERE id = $1`, id).Scan(&total, &contexts); err != nil {
		t.Fatal(err)
	}
	if total != 8 || contexts != 2 {
		t.Errorf("trial has %d threads, %d contexts per node; want 8 and 2", total, contexts)
	}
}

// readSolveCalls reads a TAU profile file as text: the calls of its flat
// "solve" line and its metadata line.
func readSolveCalls(t *testing.T, path string) (uint64, string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var meta string
	calls := uint64(0)
	for i := 0; sc.Scan(); i++ {
		line := sc.Text()
		if i == 1 {
			meta = line
		}
		if rest, ok := strings.CutPrefix(line, `"solve" `); ok {
			n, err := strconv.ParseUint(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				t.Fatalf("%s: solve line %q", path, line)
			}
			calls = n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls, meta
}

// BenchmarkReadTrialFromStore builds the trial of 1,024 threads, each with
// a snapshot and a final profile and 10 metadata records, read through a
// SQLite provenance store: the summary path of kipimo run. It reports the
// records read per second.
func BenchmarkReadTrialFromStore(b *testing.B) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "provenance.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const threads = 1024
	var prof []provenance.ThreadProfile
	var meta []provenance.Metadata
	for r := uint32(0); r < threads; r++ {
		final := provenance.ThreadProfile{Rank: r, Step: 20, Final: true, Timers: []provenance.TimerProfile{
			{Name: "main", Calls: 1, Subrs: 4, Inclusive: 100, Exclusive: 10},
			{Name: "solve", Calls: 4, Inclusive: 90, Exclusive: 90},
			{Name: "main => solve", Calls: 4, Inclusive: 90, Exclusive: 90},
		}}
		snap := final
		snap.Step, snap.Final = 10, false
		prof = append(prof, snap, final)
		for k := 0; k < 10; k++ {
			meta = append(meta, provenance.Metadata{RID: r, Descr: "key " + strconv.Itoa(k), Value: "v"})
		}
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindProfiles, Profiles: prof}); err != nil {
		b.Fatal(err)
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindMetadata, Metadata: meta}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		tr, err := ReadTrial(ctx, st, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if len(tr.RealThreads()) != threads {
			b.Fatalf("%d threads, want %d", len(tr.RealThreads()), threads)
		}
	}
	b.ReportMetric(float64(len(prof)+len(meta))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
