package taudb

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// generatedTrial builds a trial of threads threads (ranks of one thread) and
// timers flat timers under one root, with every timer on every thread.
func generatedTrial(threads, timers int) *Trial {
	tr := NewTrial(fmt.Sprintf("generated %dx%d", threads, timers))
	m := tr.AddMetric("TIME")
	names := make([]*TimerCallpath, timers)
	for i := range names {
		t := tr.AddTimer(fmt.Sprintf("void kernel_%d(double *) C [{kernels.c} {%d,1}-{%d,1}]", i, 10*i+1, 10*i+9))
		t.Groups = []string{"TAU_USER"}
		names[i] = t.Root()
	}
	for r := 0; r < threads; r++ {
		th := tr.AddThread(r, 0, 0, r)
		th.Metadata = []Attribute{{Name: "pid", Value: fmt.Sprint(1000 + r)}, {Name: "Hostname", Value: "node"}}
		for i, c := range names {
			d := tr.AddCallData(th, c)
			d.Calls, d.Subroutines = float64(1+i%7), 0
			v := float64((r*7919+i*104729)%100000) + 0.25
			d.SetValue(m, v, v)
		}
	}
	tr.UpdateShape()
	tr.ComputeDerived()
	tr.SplitMetadata(LoaderMetadata()...)
	return tr
}

// cpuTime is the time process pid has run on a CPU, and false where that
// cannot be read. For pid 0 it is this process, all threads (Linux:
// utime+stime of /proc/self/stat, in clock ticks of 10 ms); otherwise the
// single-threaded PostgreSQL backend pid (the first field of
// /proc/PID/schedstat, in ns).
func cpuTime(pid int) (time.Duration, bool) {
	if pid == 0 {
		b, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			return 0, false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			return 0, false
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		k, err2 := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+k) * 10 * time.Millisecond, err1 == nil && err2 == nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err == nil
}

// cpuMeter adds up the CPU time of this process and of the PostgreSQL
// backends connected to the store's database. The server's share is only
// known when it runs on this machine and its /proc entries are readable.
type cpuMeter struct {
	s      *Store
	client time.Duration
	server map[int]time.Duration
	ok     bool
}

func (m *cpuMeter) backends(ctx context.Context) (map[int]time.Duration, bool) {
	rows, err := m.s.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return nil, false
	}
	out := map[int]time.Duration{}
	for _, p := range pids {
		t, ok := cpuTime(int(p))
		if !ok {
			return nil, false
		}
		out[int(p)] = t
	}
	return out, true
}

func (m *cpuMeter) start(ctx context.Context) {
	m.client, _ = cpuTime(0)
	m.server, m.ok = m.backends(ctx)
}

// stop returns the CPU time used since start by this process and by the
// server's backends (ok false when the latter is unknown).
func (m *cpuMeter) stop(ctx context.Context) (client, server time.Duration, ok bool) {
	c, _ := cpuTime(0)
	now, ok := m.backends(ctx)
	if !ok || !m.ok {
		return c - m.client, 0, false
	}
	for pid, t := range now {
		server += t - m.server[pid] // a backend that started during the save had 0
	}
	return c - m.client, server, true
}

// BenchmarkSaveTrial stores a generated 1,024-thread, 500-timer trial (514,500
// timer_value rows with the derived threads) per iteration and reports
// timer_value rows per second of the whole save (trusted-ids: the default
// for a superuser, foreign-key triggers off; fk-checks: PostgreSQL checks
// every reference), and of the timer_value COPY alone (value-copy).
//
// As the machine may be busy with other work, the whole-save modes also
// report rows per CPU-second of this process (rows/client-cpu-s, the
// generated trial is built before timing starts) and of the PostgreSQL
// backends (rows/server-cpu-s, when the server runs on this machine). A
// save's server side runs in one backend, so rows/server-cpu-s bounds
// rows/s.
func BenchmarkSaveTrial(b *testing.B) {
	tr := generatedTrial(1024, 500)
	for _, mode := range []struct {
		name     string
		checks   bool
		copyOnly bool
	}{{"trusted-ids", false, false}, {"fk-checks", true, false}, {"value-copy", false, true}} {
		b.Run(mode.name, func(b *testing.B) {
			s := openStore(b)
			s.ForeignKeyChecks = mode.checks
			ctx := context.Background()
			var values int64
			var elapsed, clientCPU, serverCPU time.Duration
			serverKnown := true
			meter := &cpuMeter{s: s}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				meter.start(ctx)
				start := time.Now()
				st, err := s.SaveTrial(ctx, tr)
				wall := time.Since(start)
				if mode.copyOnly {
					elapsed += st.TimerValueCopy
				} else {
					elapsed += wall
				}
				if err != nil {
					b.Fatal(err)
				}
				c, sv, ok := meter.stop(ctx)
				clientCPU += c
				serverCPU += sv
				serverKnown = serverKnown && ok
				values += st.TimerValues
				b.Logf("save: %v (client CPU %v, server CPU %v), call data COPY %v, value COPY %v", wall.Round(time.Millisecond),
					c.Round(time.Millisecond), sv.Round(time.Millisecond), st.CallDataCopy.Round(time.Millisecond), st.TimerValueCopy.Round(time.Millisecond))
			}
			b.ReportMetric(float64(values)/elapsed.Seconds(), "rows/s")
			if !mode.copyOnly {
				b.ReportMetric(float64(values)/clientCPU.Seconds(), "rows/client-cpu-s")
				if serverKnown {
					b.ReportMetric(float64(values)/serverCPU.Seconds(), "rows/server-cpu-s")
				}
			}
		})
	}
	// The machine's own COPY speed at the time, for scale: the same number
	// of timer_value-shaped rows into a temporary table with no index or
	// foreign key.
	b.Run("plain-table-copy", func(b *testing.B) {
		s := openStore(b)
		ctx := context.Background()
		const n = 514500
		var elapsed time.Duration
		for i := 0; i < b.N; i++ {
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `CREATE TEMP TABLE plain (a int, b int, c float8, d float8, e float8, f float8, g float8) ON COMMIT DROP`); err != nil {
					return err
				}
				start := time.Now()
				_, err := copyNumeric(ctx, tx, "plain", []string{"a", "b", "c", "d", "e", "f", "g"}, n, func(i int, buf []byte) []byte {
					buf = appendTuple(buf, 7)
					buf = appendI4(buf, int32(i))
					buf = appendI4(buf, 1)
					for k := 0; k < 4; k++ {
						buf = appendF8(buf, float64(i)+0.5)
					}
					return appendNull(buf)
				})
				elapsed += time.Since(start)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "rows/s")
	})
}
