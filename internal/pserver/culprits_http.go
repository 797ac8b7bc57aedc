package pserver

import "net/http"

// culpritRoutes adds the culprit analysis to the HTTP API:
//
//	GET /api/culprits?n=N   Culprits: culprits, outlier ranks (at most N
//	                        rows each, default 100, 0 for all) and the latest bursts
//	GET /api/outliers?n=N   the outlier ranks alone, with the steps analysed
func (d *dashboard) culpritRoutes(api *http.ServeMux) {
	get := func(r *http.Request) (Culprits, error) {
		n, err := intParam(r, "n", 100)
		if err != nil {
			return Culprits{}, err
		}
		var c Culprits
		analysis := d.culprits
		if analysis == nil {
			analysis = func(st *State) Culprits { return st.Culprits(false) }
		}
		d.view(func(st *State) { c = analysis(st) })
		if n > 0 {
			c.Culprits = c.Culprits[:min(n, len(c.Culprits))]
			c.Outliers = c.Outliers[:min(n, len(c.Outliers))]
		}
		return c, nil
	}
	api.HandleFunc("GET /api/culprits", func(w http.ResponseWriter, r *http.Request) {
		c, err := get(r)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, c)
	})
	api.HandleFunc("GET /api/outliers", func(w http.ResponseWriter, r *http.Request) {
		c, err := get(r)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, map[string]any{"steps_analysed": c.Steps, "outlier_ranks": c.Outliers})
	})
}
