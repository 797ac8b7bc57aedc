package run

import (
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// KindScore is how many injected anomalies of one kind were found.
type KindScore struct {
	Kind     string  `json:"kind"`
	Injected int     `json:"injected"`
	Found    int     `json:"found"`
	Recall   float64 `json:"recall"`
}

// Score compares flagged executions with the injected ground truth. An
// anomaly is a true positive when an injected execution has the same program,
// rank, thread, function and entry time.
type Score struct {
	Flagged       int         `json:"flagged"`
	TruePositives int         `json:"true_positives"`
	Injected      int         `json:"injected"`
	Precision     float64     `json:"precision"`
	Recall        float64     `json:"recall"`
	Kinds         []KindScore `json:"kinds"`
}

type execKey struct {
	pid, rank, tid uint32
	entry          uint64
	fn             string
}

// ScoreAnomalies computes precision and recall of anomalies against truth.
func ScoreAnomalies(truth []workload.Truth, anomalies []provenance.Exec) Score {
	injected := make(map[execKey]workload.Kind, len(truth))
	perKind := map[string]*KindScore{}
	for _, t := range truth {
		injected[execKey{t.PID, t.Rank, t.Tid, t.Entry, t.Func}] = t.Kind
		ks := perKind[string(t.Kind)]
		if ks == nil {
			ks = &KindScore{Kind: string(t.Kind)}
			perKind[string(t.Kind)] = ks
		}
		ks.Injected++
	}
	s := Score{Flagged: len(anomalies), Injected: len(truth)}
	seen := make(map[execKey]bool, len(anomalies))
	for _, a := range anomalies {
		k := execKey{a.PID, a.RID, a.TID, a.Entry, a.Func}
		kind, ok := injected[k]
		if !ok || seen[k] {
			continue
		}
		seen[k] = true
		s.TruePositives++
		perKind[string(kind)].Found++
	}
	if s.Flagged > 0 {
		s.Precision = float64(s.TruePositives) / float64(s.Flagged)
	}
	if s.Injected > 0 {
		s.Recall = float64(s.TruePositives) / float64(s.Injected)
	}
	for _, ks := range perKind {
		if ks.Injected > 0 {
			ks.Recall = float64(ks.Found) / float64(ks.Injected)
		}
		s.Kinds = append(s.Kinds, *ks)
	}
	sort.Slice(s.Kinds, func(i, j int) bool { return s.Kinds[i].Kind < s.Kinds[j].Kind })
	return s
}
