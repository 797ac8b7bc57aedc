package pserver

import (
	"net/http"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// LiveFuncStats is the reply of GET /api/func_stats: the run's models
// merged so far, as the func_stats records the pserver would write were the
// run to end now (Server.FuncStatsRecords), and how far the run has got.
// Its func_stats key is the one provdb's /api/v1/func_stats answers with,
// so that what reads a finished run's final models reads these too
// (kipimo diff).
type LiveFuncStats struct {
	Run string `json:"run"`
	// Status is Summary's: StatusLive while the run goes, StatusFinished
	// once the server has stopped taking syncs.
	Status string `json:"status"`
	// Shard and Shards say which model keys the reply holds: those of
	// Shard of Shards (syncproto.Shard).
	Shard  int `json:"shard"`
	Shards int `json:"shards"`
	// IOSteps is how many io_steps the run has had so far, IOStep the last
	// of them (nil before any).
	IOSteps   uint64                       `json:"io_steps"`
	IOStep    *uint64                      `json:"io_step"`
	FuncStats []provenance.GlobalFuncStats `json:"func_stats"`
}

// funcStatsRoutes adds the run's models merged so far to the HTTP API:
//
//	GET /api/func_stats   LiveFuncStats; 404 on a finished run's dashboard
//	                      (its store has the final records)
func (d *dashboard) funcStatsRoutes(api *http.ServeMux) {
	api.HandleFunc("GET /api/func_stats", func(w http.ResponseWriter, _ *http.Request) {
		if d.funcStats == nil {
			httpError(w, http.StatusNotFound, "this dashboard shows a finished run: read its final models from its store (kipimo diff RUNDIR, or provdb's /api/v1/func_stats)")
			return
		}
		var v LiveFuncStats
		d.view(func(st *State) { v = d.funcStats(st) })
		writeJSON(w, v)
	})
}

// liveFuncStats is st's models merged so far (GET /api/func_stats), under
// the state's lock.
func (s *Server) liveFuncStats(st *State) LiveFuncStats {
	status := StatusLive
	if s.finished.Load() {
		status = StatusFinished
	}
	v := LiveFuncStats{Run: s.cfg.Run, Status: status, Shard: s.cfg.Shard, Shards: s.cfg.Shards,
		IOSteps: ioSteps(st), FuncStats: s.funcStatsRecords(st)}
	if v.IOSteps > 0 {
		last := v.IOSteps - 1
		v.IOStep = &last
	}
	return v
}
