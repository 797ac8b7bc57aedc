package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// fakeDetectors answers call-stack probes for ranks 0..n-1 of run, on the
// scatter-gather subject and on each rank's own subject, like detectors do.
func fakeDetectors(t *testing.T, url, run string, n int) {
	t.Helper()
	nc, err := natsx.Connect(context.Background(), url, "fake-detectors")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	subj := natsx.Subjects{Run: run}
	for r := range uint32(n) {
		rep := syncproto.CallstackReply{PID: 0, Rank: r, IOStep: 40 + uint64(r), Threads: []syncproto.ThreadStack{
			{TID: 0, Frames: []syncproto.OpenFrame{
				{FID: 1, Func: "main", Entry: 100, EventID: "x:0:1"},
				{FID: 7, Func: "MPI_Allreduce", Entry: 900 + uint64(r), EventID: "x:40:9"},
			}},
			{TID: 3, GPU: true},
		}}
		answer := func(m *nats.Msg) {
			var req syncproto.CallstackRequest
			if err := json.Unmarshal(m.Data, &req); err != nil || (req.Rank != nil && *req.Rank != rep.Rank) {
				return
			}
			data, _ := json.Marshal(rep)
			_ = m.Respond(data)
		}
		for _, s := range []string{subj.AllCallstacks(), subj.Callstack(0, r)} {
			if _, err := nc.Subscribe(s, answer); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestCallstackGathersEveryRank(t *testing.T) {
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	fakeDetectors(t, ns.ClientURL(), "cs", 3)

	t.Run("text", func(t *testing.T) {
		out, _, err := runKipimo(t, nil, "callstack", "--nats", ns.ClientURL(), "--run", "cs", "--quiet", "100ms")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"3 ranks, 6 threads", "rank 0 (pid 0, io_step 40)", "rank 2 (pid 0, io_step 42)", "thread 3 (GPU)", "(no open frames)", "MPI_Allreduce", "entry 902"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Index(out, "rank 0 ") > strings.Index(out, "rank 1 ") || strings.Index(out, "  main") > strings.Index(out, "MPI_Allreduce") {
			t.Errorf("ranks or frames out of order:\n%s", out)
		}
	})
	t.Run("json", func(t *testing.T) {
		out, _, err := runKipimo(t, nil, "callstack", "--json", "--nats", ns.ClientURL(), "--run", "cs", "--quiet", "100ms")
		if err != nil {
			t.Fatal(err)
		}
		var reps []syncproto.CallstackReply
		if err := json.Unmarshal([]byte(out), &reps); err != nil {
			t.Fatalf("--json output does not parse: %v\n%s", err, out)
		}
		if len(reps) != 3 || reps[1].Rank != 1 || len(reps[1].Threads[0].Frames) != 2 {
			t.Errorf("json replies %+v", reps)
		}
	})
	t.Run("one rank", func(t *testing.T) {
		out, _, err := runKipimo(t, nil, "callstack", "--rank", "1", "--json", "--nats", ns.ClientURL(), "--run", "cs")
		if err != nil {
			t.Fatal(err)
		}
		var reps []syncproto.CallstackReply
		if err := json.Unmarshal([]byte(out), &reps); err != nil || len(reps) != 1 || reps[0].Rank != 1 {
			t.Errorf("--rank 1 gave %s (%v)", out, err)
		}
	})
	t.Run("watch", func(t *testing.T) {
		var out, errOut bytes.Buffer
		root := NewRoot(&out, &errOut)
		root.SetArgs([]string{"callstack", "--watch", "--interval", "50ms", "--quiet", "50ms", "--nats", ns.ClientURL(), "--run", "cs"})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out.String(), "global call stack of run cs"); n < 2 {
			t.Errorf("--watch printed %d refreshes, want at least 2", n)
		}
	})
	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			want string
		}{
			{"no run", []string{"callstack", "--nats", ns.ClientURL()}, "--run is required"},
			{"no detectors", []string{"callstack", "--nats", ns.ClientURL(), "--run", "other", "--timeout", "200ms"}, "no detector answered"},
			{"bad url", []string{"callstack", "--nats", "http://x", "--run", "cs"}, "scheme"},
			{"not a run directory", []string{"callstack", t.TempDir(), "--run", "cs"}, "no run is running there"},
			{"two positionals", []string{"callstack", "a", "b"}, "accepts at most 1 arg"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				_, _, err := runKipimo(t, nil, tc.args...)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want one containing %q", err, tc.want)
				}
			})
		}
	})
}
