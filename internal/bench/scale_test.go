package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"net/http/httptest"
)

// TestScaleCostPerRankFlat runs the whole pipeline at 128 and 1,024 ranks
// and fails if the time per rank-step at 1,024 ranks is more than twice
// the one at 128 (medians of several runs, so that a busy moment on a
// shared machine does not decide it).
func TestScaleCostPerRankFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test: runs 1,024 ranks end to end")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	median := func(ranks, reps int) float64 {
		var v []float64
		for i := range reps {
			pt, err := ScaleOne(ctx, filepath.Join(dir, strconv.Itoa(ranks), strconv.Itoa(i)), ranks, 5, 1000, 1)
			if err != nil {
				t.Fatalf("%d ranks: %v", ranks, err)
			}
			if pt.Recall < 0.99 || pt.Precision < 0.99 {
				t.Errorf("%d ranks: precision %.3f recall %.3f", ranks, pt.Precision, pt.Recall)
			}
			if pt.Events <= 0 || pt.Anomalies == 0 {
				t.Errorf("%d ranks: %d events published, %d anomalies", ranks, pt.Events, pt.Anomalies)
			}
			t.Logf("%d ranks, run %d: %.1f s, %.0f µs per rank-step (detect %.1f s, drain %.1f s, profiles %.1f s)", ranks, i, pt.WallSeconds, pt.MicrosPerRankStep, pt.DetectSeconds, pt.DrainSeconds, pt.ProfileSeconds)
			v = append(v, pt.MicrosPerRankStep)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	small := median(128, 3)
	large := median(1024, 3)
	t.Logf("median µs per rank-step: 128 ranks %.0f, 1,024 ranks %.0f (ratio %.2f)", small, large, large/small)
	if large > 2*small {
		t.Errorf("time per rank-step grows %.2fx from 128 to 1,024 ranks (%.0f -> %.0f µs), want <= 2x", large/small, small, large)
	}
}

// BenchmarkScale runs the whole pipeline once per iteration at
// KIPIMO_SCALE_RANKS ranks (default 256), for profiling.
func BenchmarkScale(b *testing.B) {
	ranks := 256
	if s := os.Getenv("KIPIMO_SCALE_RANKS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		ranks = n
	}
	dir := b.TempDir()
	var events int64
	var wall float64
	for i := 0; b.Loop(); i++ {
		pt, err := ScaleOne(context.Background(), filepath.Join(dir, strconv.Itoa(i)), ranks, 5, 1000, 1)
		if err != nil {
			b.Fatal(err)
		}
		events += pt.Events
		wall += pt.WallSeconds
	}
	b.ReportMetric(float64(events)/wall, "events/s")
}

func TestParseHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_seconds", Buckets: []float64{0.001, 0.01, 0.1}})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "y_total"}, []string{"result"})
	reg.MustRegister(h, c)
	c.WithLabelValues("applied").Add(7)
	c.WithLabelValues("duplicate").Add(2)
	// 60 observations at 0.5 ms, 30 at 5 ms, 9 at 50 ms, 1 at 1 s: counted
	// here, apart from the exposition.
	for range 60 {
		h.Observe(0.0005)
	}
	for range 30 {
		h.Observe(0.005)
	}
	for range 9 {
		h.Observe(0.05)
	}
	h.Observe(1)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, err := scrapeHistogram(context.Background(), srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		q    float64
		want float64
	}{
		{"p50 in the first bucket", 0.5, 0.001},
		{"p60 is the first bucket's edge", 0.6, 0.001},
		{"p90 in the second", 0.9, 0.01},
		{"p99 in the third", 0.99, 0.1},
		{"p100 beyond the last bound", 1, math.Inf(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if v := got.quantile(tc.q); v != tc.want {
				t.Errorf("quantile(%g) = %g, want %g", tc.q, v, tc.want)
			}
		})
	}
	if got.count != 100 {
		t.Errorf("count %g, want 100", got.count)
	}
	for series, want := range map[string]float64{`y_total{result="applied"}`: 7, `y_total{result="duplicate"}`: 2, `y_total{result="bad"}`: 0} {
		if v, err := scrapeCounter(context.Background(), srv.URL, series); err != nil || v != want {
			t.Errorf("%s = %g (%v), want %g", series, v, err, want)
		}
	}
	if _, err := parseHistogram(strings.NewReader("y_bucket{le=\"1\"} 3\n"), "x_seconds"); err == nil {
		t.Error("a missing histogram parsed")
	}
}

func FuzzParseHistogram(f *testing.F) {
	f.Add("# TYPE x_seconds histogram\nx_seconds_bucket{le=\"0.001\"} 60\nx_seconds_bucket{le=\"+Inf\"} 100\nx_seconds_sum 1.2\nx_seconds_count 100\n")
	f.Add("x_seconds_bucket{le=\"abc\"} 1\n")
	f.Add("x_seconds_bucket{le=\"1\n")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseHistogram(strings.NewReader(s), "x_seconds")
		if err != nil {
			return
		}
		if len(h.bounds) != len(h.counts) || !slices.IsSorted(h.bounds) {
			t.Fatalf("bounds %v counts %v", h.bounds, h.counts)
		}
		_ = h.quantile(0.5)
	})
}
