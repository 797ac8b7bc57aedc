package diff

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const liveReply = `{"run":"stalls","status":"live","shard":0,"shards":1,"io_steps":4,"io_step":3,
"func_stats":[{"pid":0,"fid":1,"func":"MPI_Irecv","stats":{"count":3,"accumulate":30}}]}`

func TestDecodeLive(t *testing.T) {
	l, err := DecodeLive(strings.NewReader(liveReply))
	if err != nil {
		t.Fatal(err)
	}
	if l.Run != "stalls" || l.Status != "live" || l.Shards != 1 || l.IOSteps != 4 || l.IOStep == nil || *l.IOStep != 3 ||
		len(l.FuncStats) != 1 || l.FuncStats[0].Func != "MPI_Irecv" || l.FuncStats[0].Stats.Count != 3 {
		t.Errorf("decoded %+v", l)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"not JSON", `<html>`, "read the live models"},
		{"provdb's reply", `{"func_stats":[],"skipped":0}`, "not a pserver's"},
		{"no func_stats", `{"run":"r","status":"live","shards":1}`, "not a pserver's"},
		{"no shards", `{"run":"r","status":"live","func_stats":[]}`, "shard 0 of 0"},
		{"shard beyond", `{"run":"r","status":"live","shard":2,"shards":2,"func_stats":[]}`, "shard 2 of 2"},
		{"io_step without io_steps", `{"run":"r","status":"live","shards":1,"io_step":0,"func_stats":[]}`, "does not end 0 io_steps"},
		{"io_steps without io_step", `{"run":"r","status":"live","shards":1,"io_steps":2,"func_stats":[]}`, "io_step null"},
		{"io_step not the last", `{"run":"r","status":"live","shards":1,"io_steps":2,"io_step":0,"func_stats":[]}`, "io_step 0 does not end 2"},
		{"unnamed record", `{"run":"r","status":"live","shards":1,"func_stats":[{"fid":1}]}`, "record 0 names no function"},
	} {
		if _, err := DecodeLive(strings.NewReader(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// FetchLive sends the dashboard's token, and tells a server without live
// models (404) from one that refuses the token.
func TestFetchLive(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != LivePath:
			http.NotFound(w, r)
		case r.Header.Get("Authorization") != "Bearer s3cret":
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		default:
			_, _ = w.Write([]byte(liveReply))
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	l, err := FetchLive(ctx, srv.URL+"/", "s3cret")
	if err != nil || l.Run != "stalls" || l.URL != srv.URL+"/" {
		t.Fatalf("FetchLive: %+v, %v", l, err)
	}
	if _, err := FetchLive(ctx, srv.URL, ""); err == nil || errors.Is(err, ErrNotLive) || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("without the token: %v, want a refusal that names --token-file", err)
	}
	if _, err := FetchLive(ctx, srv.URL+"/elsewhere", "s3cret"); !errors.Is(err, ErrNotLive) {
		t.Errorf("a server without live models: %v, want ErrNotLive", err)
	}
	if _, err := FetchLive(ctx, "127.0.0.1:8080", ""); err == nil || !strings.Contains(err.Error(), "http://host:port") {
		t.Errorf("a URL without a scheme: %v", err)
	}
}

func FuzzDecodeLive(f *testing.F) {
	f.Add([]byte(liveReply))
	f.Add([]byte(`{"run":"r","status":"live","shards":1,"func_stats":[]}`))
	f.Add([]byte(`{"run":"r","status":"live","shards":2,"shard":1,"io_steps":1,"io_step":0,"func_stats":[{"func":"f","natural_hist":{"lo":3,"counts":[1],"mins":[1],"maxs":[1]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := DecodeLive(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		if l.Status == "" || l.Shard < 0 || l.Shard >= l.Shards || (l.IOStep != nil && *l.IOStep+1 != l.IOSteps) {
			t.Fatalf("accepted an inconsistent reply: %+v", l)
		}
		for _, f := range l.FuncStats {
			if f.Func == "" {
				t.Fatal("accepted a record without a function")
			}
		}
	})
}
