package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// bigStore writes n anomalies, generated batch by batch (one program per
// batch, so that keys stay unique), to a new SQLite store. Each batch is in
// time order, as the detector sends them.
func bigStore(t *testing.T, n int) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "big.db")
	s, err := sqlitestore.Open(ctx, path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const batch = 10000
	for b := 0; b*batch < n; b++ {
		execs := storetest.Generate(storetest.GenConfig{Seed: uint64(100 + b), N: min(batch, n-b*batch), Ranks: 16, Steps: 50, Window: 2, Anomaly: true})
		for i := range execs {
			execs[i].PID = uint32(b)
		}
		slices.SortFunc(execs, func(x, y provenance.Exec) int { return cmp.Compare(x.Entry, y.Entry) })
		if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// listChecker reads the output of kipimo query list as it is written: it
// checks each record comes after the one before in the order of entry then
// key, counts them and the bytes, and samples the live heap every
// sampleEvery records.
type listChecker struct {
	json        bool
	partial     []byte
	n           int
	bytes       int64
	last        [3]string // entry, pid, event_id, as printed
	lastEntry   uint64
	lastPID     uint64
	err         error
	footer      string
	sampleEvery int
	baseHeap    uint64
	peakHeap    uint64
}

func (c *listChecker) Write(p []byte) (int, error) {
	c.bytes += int64(len(p))
	data := append(c.partial, p...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		c.line(data[:i])
		data = data[i+1:]
	}
	c.partial = append(c.partial[:0], data...)
	return len(p), nil
}

func (c *listChecker) line(l []byte) {
	if c.err != nil {
		return
	}
	var entry, pid uint64
	var id string
	if c.json {
		var e struct {
			Entry   uint64 `json:"entry"`
			PID     uint64 `json:"pid"`
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(l, &e); err != nil {
			c.err = fmt.Errorf("line %d: %w", c.n+1, err)
			return
		}
		entry, pid, id = e.Entry, e.PID, e.EventID
	} else {
		f := strings.Fields(string(l))
		switch {
		case len(f) > 0 && f[0] == "PID":
			return
		case len(f) == 2 && f[1] == "records":
			c.footer = string(l)
			return
		case len(f) < 10:
			c.err = fmt.Errorf("line %d: %q", c.n+1, l)
			return
		}
		var err1, err2 error
		pid, err1 = strconv.ParseUint(f[0], 10, 32)
		entry, err2 = strconv.ParseUint(f[5], 10, 64)
		if err1 != nil || err2 != nil {
			c.err = fmt.Errorf("line %d: %q", c.n+1, l)
			return
		}
		id = f[1]
	}
	if c.n > 0 {
		order := cmp.Or(cmp.Compare(entry, c.lastEntry), cmp.Compare(pid, c.lastPID), cmp.Compare(id, c.last[2]))
		if order <= 0 {
			c.err = fmt.Errorf("record %d (%d %d/%s) does not come after the one before (%d %d/%s)", c.n+1, entry, pid, id, c.lastEntry, c.lastPID, c.last[2])
			return
		}
	}
	c.lastEntry, c.lastPID, c.last[2] = entry, pid, id
	c.n++
	if c.n%c.sampleEvery == 0 {
		c.peakHeap = max(c.peakHeap, liveHeap())
	}
}

// liveHeap is the bytes of the heap still in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestQueryListAll lists 200,000 anomalies with --limit 0, from the store
// file and through provdb's HTTP API, as JSON lines and as a table: every
// record comes once, in order, and the live heap grows by far less than
// the size of the listing.
func TestQueryListAll(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 records: skipped in -short mode")
	}
	const n = 200000
	path := bigStore(t, n)
	st, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, "tok"))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		json bool
	}{
		{"store json", []string{"--store", path, "--json"}, true},
		{"http json", []string{"--url", srv.URL, "--token-file", tokenFile, "--json"}, true},
		{"store table", []string{"--store", path}, false},
	}
	// The size of the records, as JSON lines; the first case measures it.
	var recordBytes int64
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &listChecker{json: tc.json, sampleEvery: 20000, baseHeap: liveHeap()}
			var errb bytes.Buffer
			root := NewRoot(c, &errb)
			root.SetArgs(append([]string{"query", "list", "--limit", "0"}, tc.args...))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if c.err != nil {
				t.Fatal(c.err)
			}
			if c.n != n {
				t.Fatalf("%d records listed, want %d", c.n, n)
			}
			if !tc.json && c.footer != fmt.Sprintf("%d records", n) {
				t.Fatalf("footer %q", c.footer)
			}
			if tc.json {
				recordBytes = c.bytes
			}
			growth := int64(c.peakHeap) - int64(c.baseHeap)
			t.Logf("%d records, %d MB printed, %d MB of records; live heap grew by at most %.1f MB (%.0f B/record)",
				c.n, c.bytes>>20, recordBytes>>20, float64(growth)/(1<<20), float64(growth)/float64(n))
			if growth > recordBytes/10 {
				t.Fatalf("live heap grew by %d bytes while listing %d bytes of records: not streamed", growth, recordBytes)
			}
		})
	}
}
