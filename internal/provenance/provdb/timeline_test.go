package provdb

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// The timeline endpoint the dashboard's record view links to: a record's
// window as a Perfetto timeline, offered for download; choices it cannot
// answer get 400 or 404 with a message.
func TestHTTPTimeline(t *testing.T) {
	s, execs := filledStore(t)
	srv := httptest.NewServer(NewHTTPHandler(s, "tok"))
	defer srv.Close()
	e := execs[0]
	q := url.Values{"record": {e.EventID}, "pid": {fmt.Sprint(e.PID)}}
	code, body, hdr := get(t, srv, "/api/v1/timeline?"+q.Encode(), "tok")
	if code != http.StatusOK {
		t.Fatalf("timeline of %s: %d %s", e.EventID, code, body)
	}
	if cd := hdr.Get("Content-Disposition"); !strings.Contains(cd, "kipimo-timeline-"+strings.ReplaceAll(e.EventID, ":", "-")+".json") {
		t.Errorf("Content-Disposition %q does not name the record's timeline", cd)
	}
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Cat  string         `json:"cat"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("not a JSON trace: %v", err)
	}
	ids := map[string]int{}
	for _, ev := range doc.TraceEvents {
		if ev.Ph == "X" && ev.Cat != "message" {
			id, _ := ev.Args["event_id"].(string)
			ids[id]++
		}
	}
	for _, w := range e.EventWindow.ExecWindow {
		if ids[w.EventID] == 0 {
			t.Errorf("window execution %s missing from the timeline", w.EventID)
		}
	}
	if ids[e.EventID] != 1 {
		t.Errorf("the record's execution %s is in the timeline %d times", e.EventID, ids[e.EventID])
	}
	for _, c := range []struct {
		query string
		code  int
		want  string
	}{
		{"", http.StatusBadRequest, "choose what to export"},
		{"record=x", http.StatusBadRequest, "event_id"},
		{"record=0:999:999", http.StatusNotFound, "not found"},
		{"ranks=a", http.StatusBadRequest, "ranks"},
		{"steps=5-1", http.StatusBadRequest, "empty"},
		{"steps=900-901", http.StatusNotFound, "no records"},
		{"record=" + e.EventID + "&margin=-1", http.StatusBadRequest, "margin"},
		{"record=" + e.EventID + "&limit=3", http.StatusBadRequest, "unknown parameter"},
	} {
		code, body, _ := get(t, srv, "/api/v1/timeline?"+c.query, "tok")
		if code != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("?%s: %d %s, want %d saying %q", c.query, code, body, c.code, c.want)
		}
	}
	if code, _, _ := get(t, srv, "/api/v1/timeline?"+q.Encode(), ""); code != http.StatusUnauthorized {
		t.Errorf("timeline without the token: %d, want 401", code)
	}
}
