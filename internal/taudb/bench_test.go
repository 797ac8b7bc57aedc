package taudb

import (
	"context"
	"fmt"
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

// BenchmarkSaveTrial stores a generated 1,024-thread, 500-timer trial (514,500
// timer_value rows with the derived threads) per iteration and reports
// timer_value rows per second of the whole save (trusted-ids: the default
// for a superuser, foreign-key triggers off; fk-checks: PostgreSQL checks
// every reference), and of the timer_value COPY alone (value-copy).
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
			var elapsed time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				st, err := s.SaveTrial(ctx, tr)
				if mode.copyOnly {
					elapsed += st.TimerValueCopy
				} else {
					elapsed += time.Since(start)
				}
				if err != nil {
					b.Fatal(err)
				}
				values += st.TimerValues
				b.Logf("save: call data COPY %v, value COPY %v", st.CallDataCopy, st.TimerValueCopy)
			}
			b.ReportMetric(float64(values)/elapsed.Seconds(), "rows/s")
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
