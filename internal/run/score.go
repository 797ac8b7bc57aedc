package run

import (
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/instrument"
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
	// Live runs with injected delays only (ScoreInjected): Propagated are
	// flagged executions of the injected functions that overlap an injected
	// delay on another rank (the delay reached them through a message),
	// counted in Flagged but neither true nor false positives;
	// FlaggedOtherFunctions are anomalies in functions nobody injected
	// into, not counted in Flagged.
	Propagated            int `json:"propagated,omitempty"`
	FlaggedOtherFunctions int `json:"flagged_other_functions,omitempty"`
	// Live is the score of the labels as they stood during the run, when
	// the figures above are those of the end-of-run relabelling.
	Live *LiveScore `json:"live,omitempty"`
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

// ScoreInjected scores a live run's anomalies against the delays its event
// library injected (truth, from the processes' status files). Only
// executions of the injected functions count. A flagged execution is a true
// positive when it is an injected one (same program, rank, thread, function
// and entry time); propagated when it overlaps in time an injected delay on
// another rank; otherwise a false positive. Precision is true positives over
// flagged minus propagated; recall true positives over injected.
func ScoreInjected(truth []workload.Truth, inj []instrument.Injection, anomalies []provenance.Exec) Score {
	funcs := map[string]bool{}
	for _, in := range inj {
		funcs[in.Func] = true
	}
	byEntry := append([]workload.Truth(nil), truth...)
	sort.Slice(byEntry, func(i, j int) bool { return byEntry[i].Entry < byEntry[j].Entry })
	var longest uint64
	for _, t := range byEntry {
		longest = max(longest, t.Exit-t.Entry)
	}
	var ours []provenance.Exec
	other := 0
	for _, a := range anomalies {
		if funcs[a.Func] {
			ours = append(ours, a)
		} else {
			other++
		}
	}
	s := ScoreAnomalies(truth, ours)
	s.FlaggedOtherFunctions = other
	injected := make(map[execKey]bool, len(truth))
	for _, t := range truth {
		injected[execKey{t.PID, t.Rank, t.Tid, t.Entry, t.Func}] = true
	}
	for _, a := range ours {
		if injected[execKey{a.PID, a.RID, a.TID, a.Entry, a.Func}] {
			continue
		}
		// Delays that may overlap [a.Entry, a.Exit]: entries from
		// a.Entry-longest up to a.Exit.
		lo := uint64(0)
		if a.Entry > longest {
			lo = a.Entry - longest
		}
		i := sort.Search(len(byEntry), func(i int) bool { return byEntry[i].Entry >= lo })
		for ; i < len(byEntry) && byEntry[i].Entry < a.Exit; i++ {
			t := byEntry[i]
			if t.Rank != a.RID && t.Exit > a.Entry {
				s.Propagated++
				break
			}
		}
	}
	if d := s.Flagged - s.Propagated; d > 0 {
		s.Precision = float64(s.TruePositives) / float64(d)
	} else {
		s.Precision = 0
	}
	return s
}

// ColdSteps is how many io_steps count as a code's first iterations, whose
// natural tail a detector has not seen yet: live precision is reported for
// them and for the steps after apart.
const ColdSteps = 10

// PhaseScore is the live labels' precision in one phase of a run.
type PhaseScore struct {
	Flagged       int     `json:"flagged"`
	TruePositives int     `json:"true_positives"`
	Precision     float64 `json:"precision"`
}

// LiveScore is how the labels stood during the run, before the end-of-run
// relabelling: overall, in the first ColdSteps io_steps and after them.
type LiveScore struct {
	Flagged       int        `json:"flagged"`
	TruePositives int        `json:"true_positives"`
	Precision     float64    `json:"precision"`
	Recall        float64    `json:"recall"`
	Cold          PhaseScore `json:"cold"` // io_steps 0..ColdSteps-1
	Warm          PhaseScore `json:"warm"` // io_steps from ColdSteps on
	Unflagged     int        `json:"unflagged"`
}

// ScoreFinal scores the anomalies a user finally sees: those final keeps
// (the end-of-run relabelling with the final models; nil keeps every
// anomaly). The live labels' scores go in Score.Live.
func ScoreFinal(truth []workload.Truth, anomalies []provenance.Exec, final func(*provenance.Exec) bool) Score {
	live := ScoreAnomalies(truth, anomalies)
	injected := make(map[execKey]bool, len(truth))
	for _, t := range truth {
		injected[execKey{t.PID, t.Rank, t.Tid, t.Entry, t.Func}] = true
	}
	ls := &LiveScore{Flagged: live.Flagged, TruePositives: live.TruePositives, Precision: live.Precision, Recall: live.Recall}
	kept := anomalies[:0:0]
	for i := range anomalies {
		a := &anomalies[i]
		ph := &ls.Warm
		if a.IOStep < ColdSteps {
			ph = &ls.Cold
		}
		ph.Flagged++
		if injected[execKey{a.PID, a.RID, a.TID, a.Entry, a.Func}] {
			ph.TruePositives++
		}
		if final == nil || final(a) {
			kept = append(kept, *a)
		} else {
			ls.Unflagged++
		}
	}
	for _, ph := range []*PhaseScore{&ls.Cold, &ls.Warm} {
		if ph.Flagged > 0 {
			ph.Precision = float64(ph.TruePositives) / float64(ph.Flagged)
		}
	}
	s := ScoreAnomalies(truth, kept)
	s.Live = ls
	return s
}
