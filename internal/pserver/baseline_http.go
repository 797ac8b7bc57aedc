package pserver

import (
	"net/http"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
)

// baselineRoutes adds the live comparison with the run's baseline
// (Config.Baseline, kipimo run --baseline) to the HTTP API:
//
//	GET /api/baseline?n=N   baseline.Report of the models merged so far: per
//	                        function (at most N rows, default 50, 0 for all),
//	                        this run against the baseline, by extra time;
//	                        404 when the run has no baseline
func (d *dashboard) baselineRoutes(api *http.ServeMux) {
	api.HandleFunc("GET /api/baseline", func(w http.ResponseWriter, r *http.Request) {
		n, err := intParam(r, "n", 50)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		if d.cfg.Baseline == nil {
			httpError(w, http.StatusNotFound, "this run has no baseline: start it with --baseline REF (a finished run's directory, store or provdb)")
			return
		}
		var rep *baseline.Report
		d.view(func(st *State) {
			rep = baseline.Compare(referenceFor(d.cfg.Baseline, st), currentModels(st), ioSteps(st), baseline.DefaultAlpha)
		})
		if n > 0 && len(rep.Functions) > n {
			rep.Functions = rep.Functions[:n]
		}
		writeJSON(w, rep)
	})
}
