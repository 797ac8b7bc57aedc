package provdb

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/perfetto"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// TimelineMaxRecords bounds the records one /api/v1/timeline answer reads.
const TimelineMaxRecords = 50000

// timeline answers GET /api/v1/timeline?record=ID[&pid=P][&margin=µs] or
// ?steps=A-B and/or &ranks=LIST: the records chosen as kipimo export
// perfetto chooses them, as a Perfetto timeline (Chrome JSON), offered
// for download.
func (h *httpAPI) timeline(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	for k := range v {
		switch k {
		case "record", "pid", "margin", "steps", "ranks":
		default:
			writeError(w, http.StatusBadRequest, fmt.Errorf("unknown parameter %q (want record, pid, margin, steps, ranks)", k))
			return
		}
	}
	c := perfetto.Choice{Record: v.Get("record"), MaxRecords: TimelineMaxRecords}
	if c.Record == "" && !v.Has("steps") && !v.Has("ranks") {
		writeError(w, http.StatusBadRequest, errors.New("choose what to export: record=EVENT_ID, steps=A-B or ranks=LIST"))
		return
	}
	if c.Record != "" {
		if _, _, _, err := provenance.ParseEventID(c.Record); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}
	if s := v.Get("margin"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("margin %q is not a non-negative integer (µs)", s))
			return
		}
		c.Margin = n
	}
	if s := v.Get("pid"); s != "" {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("pid %q is not a non-negative 32-bit integer", s))
			return
		}
		c.PID = uint32(n)
	}
	if v.Has("steps") {
		lo, hi, err := perfetto.ParseSpan(v.Get("steps"))
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("steps: %w", err))
			return
		}
		c.StepMin, c.StepMax = &lo, &hi
	}
	if v.Has("ranks") {
		ranks, err := perfetto.ParseRanks(v.Get("ranks"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		c.Ranks = ranks
	}
	var sk provenance.Skips
	ctx := provenance.WithSkips(r.Context(), &sk)
	tl, err := perfetto.Gather(ctx, h.store, c)
	h.noteSkips(&sk)
	switch {
	case errors.Is(err, provenance.ErrNotFound), errors.Is(err, perfetto.ErrNoRecords):
		writeError(w, http.StatusNotFound, err)
		return
	case errors.Is(err, perfetto.ErrTooMany):
		writeError(w, http.StatusBadRequest, fmt.Errorf("%w: narrow the choice (steps, ranks) or use kipimo export perfetto", err))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	name := "kipimo-timeline"
	if c.Record != "" {
		name += "-" + strings.ReplaceAll(c.Record, ":", "-")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.json"`)
	if _, err := tl.Write(w); err != nil {
		h.log.Debug().Err(err).Msg("timeline answer cut short")
	}
}
