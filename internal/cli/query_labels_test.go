package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// labelledStore writes a store of live-flagged anomalies, some of which the
// final models' natural ranges unflag, and returns its path and how many
// anomalies stand and are unflagged per rank and function.
func labelledStore(t *testing.T) (path string, stand, unflagged map[string]int) {
	t.Helper()
	ctx := context.Background()
	path = filepath.Join(t.TempDir(), "prov.db")
	s, err := sqlitestore.Open(ctx, path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es := storetest.Generate(storetest.GenConfig{Seed: 34, N: 240, Ranks: 4, Steps: 6, Anomaly: true})
	// Keys per function; runtimes cycle through beyond, inside and below
	// each key's final range [50, 200].
	stand, unflagged = map[string]int{}, map[string]int{}
	keys := map[string]bool{}
	for i := range es {
		v := []float64{500, 120, 10, 130, 900}[i%5]
		es[i].Explanation = &provenance.Explanation{Key: es[i].Func, Value: v, Text: "t"}
		keys[es[i].Func] = true
		k := fmt.Sprintf("%d/%s", es[i].RID, es[i].Func)
		if v > 200 || v < 50 {
			stand[k]++
		} else {
			unflagged[k]++
		}
	}
	var fs []provenance.GlobalFuncStats
	for k := range keys {
		fs = append(fs, provenance.GlobalFuncStats{Func: k, Stats: provenance.FuncStats{Count: 1}, NaturalRange: &provenance.Range{Low: 50, High: 200}})
	}
	for _, b := range []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: es}, {Kind: provenance.KindFuncStats, FuncStats: fs}} {
		if err := s.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	return path, stand, unflagged
}

// One meaning of "anomaly": query count, agg and list agree on a store whose
// final relabelling unflagged some anomalies, by default (the anomalies that
// stand) and with each --labels value, including the words the tools print
// (the LABEL column's "anomaly", the summary's "live"), from the store and
// through provdb's HTTP API alike.
func TestQueryCountsAgreeOnLabels(t *testing.T) {
	path, stand, unflagged := labelledStore(t)
	st, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, ""))
	defer srv.Close()
	sum := func(ms ...map[string]int) map[string]int {
		out := map[string]int{}
		for _, m := range ms {
			for k, n := range m {
				out[k] += n
			}
		}
		return out
	}
	cases := []struct {
		labels []string // flags; none: the default
		want   map[string]int
	}{
		{nil, stand},
		{[]string{"--labels", "final"}, stand},
		{[]string{"--labels", "anomaly"}, stand},
		{[]string{"--labels", "unflagged"}, unflagged},
		{[]string{"--labels", "all"}, sum(stand, unflagged)},
		{[]string{"--labels", "live"}, sum(stand, unflagged)},
	}
	for _, src := range [][]string{{"--store", path}, {"--url", srv.URL}} {
		for _, tc := range cases {
			name := src[0] + "/default"
			if tc.labels != nil {
				name = src[0] + "/" + tc.labels[1]
			}
			t.Run(name, func(t *testing.T) {
				total := 0
				for _, n := range tc.want {
					total += n
				}
				args := func(a ...string) []string {
					return append(append(append([]string{"query"}, a...), tc.labels...), src...)
				}
				out, err := runQuery(t, args("count")...)
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := strconv.Atoi(strings.TrimSpace(out)); got != total {
					t.Errorf("count: %q, want %d", out, total)
				}
				out, err = runQuery(t, args("list", "--limit", "0", "--json")...)
				if err != nil {
					t.Fatal(err)
				}
				listed := map[string]int{}
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if l == "" {
						continue
					}
					var e provenance.Exec
					if err := json.Unmarshal([]byte(l), &e); err != nil {
						t.Fatal(err)
					}
					listed[fmt.Sprintf("%d/%s", e.RID, e.Func)]++
				}
				out, err = runQuery(t, args("agg", "--by", "rank,func", "--limit", "0", "--json")...)
				if err != nil {
					t.Fatal(err)
				}
				grouped := map[string]int{}
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if l == "" {
						continue
					}
					var g provenance.Group
					if err := json.Unmarshal([]byte(l), &g); err != nil {
						t.Fatal(err)
					}
					grouped[fmt.Sprintf("%d/%s", *g.Rank, g.Func)] = int(g.Count)
				}
				if fmt.Sprint(listed) != fmt.Sprint(tc.want) {
					t.Errorf("list: %v, want %v", listed, tc.want)
				}
				if fmt.Sprint(grouped) != fmt.Sprint(tc.want) {
					t.Errorf("agg: %v, want %v", grouped, tc.want)
				}
			})
		}
	}
	for _, cmd := range []string{"count", "agg", "list"} {
		if _, err := runQuery(t, "query", cmd, "--labels", "some", "--store", path); err == nil || !strings.Contains(err.Error(), "--labels") {
			t.Errorf("%s --labels some: %v", cmd, err)
		}
	}
	if _, err := runQuery(t, "query", "count", "--kind", "normalexecs", "--labels", "unflagged", "--store", path); err == nil || !strings.Contains(err.Error(), "--kind anomalies") {
		t.Errorf("count --kind normalexecs --labels unflagged: %v", err)
	}
}

// The summary of kipimo run says how many anomalies were flagged live and
// how many stand after the end-of-run relabelling; query count (by default)
// and count --labels all give the same two numbers.
func TestRunSummaryCountsAsQuery(t *testing.T) {
	out := t.TempDir()
	stdout, _, err := runCLI(t, "run", "--out", out, "--run", "s1", "--ranks", "4", "--steps", "30", "--seed", "3", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Anomalies      uint64  `json:"anomalies"`
		AnomaliesFinal *uint64 `json:"anomalies_final"`
		Stored         map[string]int64
	}
	if err := json.Unmarshal([]byte(stdout[strings.LastIndex(strings.TrimSpace(stdout), "\n")+1:]), &sum); err != nil {
		t.Fatalf("summary %q: %v", stdout, err)
	}
	if sum.AnomaliesFinal == nil || *sum.AnomaliesFinal > sum.Anomalies || *sum.AnomaliesFinal == 0 {
		t.Fatalf("summary: %d flagged live, %v stand", sum.Anomalies, sum.AnomaliesFinal)
	}
	store := filepath.Join(out, "s1")
	for _, tc := range []struct {
		labels string
		want   int64
	}{{"final", int64(*sum.AnomaliesFinal)}, {"all", sum.Stored["anomalies"]}} {
		got, err := runQuery(t, "query", "count", "--store", store, "--labels", tc.labels)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.ParseInt(strings.TrimSpace(got), 10, 64); n != tc.want {
			t.Errorf("query count --labels %s: %s, the summary says %d", tc.labels, got, tc.want)
		}
	}
}
