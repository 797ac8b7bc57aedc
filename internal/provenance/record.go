// Package provenance defines the provenance records Kipimo keeps (anomalies,
// sampled normal executions, metadata, global function and counter statistics,
// per-thread profiles), the Store they are written to, and the queries users run
// on them. Field names follow Chimbuko's provenance schema exactly.
//
// Execution records go through a hand-written JSON codec (execjson.go), not a
// library: AppendExecJSON writes exactly json.Marshal's bytes, and the batch
// decoder reads documents as encoding/json does but rejects duplicate and
// case-folded keys. It was measured against github.com/go-json-experiment/json
// and encoding/json/v2, set up to write the same bytes and to reject duplicate
// keys (neither can reject case-folded keys while skipping unknown ones, so
// they do a little less); a library was to replace it within 1.5× of its
// speed, and none comes near. Medians of 6 interleaved runs with -cpu 1, per
// second of the process's CPU time, 500 anomaly records of 2,859 B each (5+5
// event window), Go 1.26.8 with GOEXPERIMENT=jsonv2, a 2-vCPU AMD VM ("Oxide
// Virtual Turin-like") shared with other jobs, 2026-11-25:
//
//	records/cpu-s        encode          decode          decode allocs/500 records
//	hand-written         435.5k          137.0k          151
//	go-json-experiment   140.7k (3.1×)   42.5k (3.2×)    17,020
//	encoding/json/v2     134.8k (3.2×)   42.0k (3.3×)    17,020
//	encoding/json        79.1k (5.5×)    47.5k (2.9×)    17,020 (v1 API on v2 under the experiment)
//
// Wall-clock medians, noisier on the loaded machine, rank them the same
// (hand-written 186k and 69k records/s, go-json-experiment 68k and 20k).
// Re-run with (without GOEXPERIMENT the encoding/json/v2 row is left out)
//
//	GOEXPERIMENT=jsonv2 go test -run '^$' -bench ExecJSON -cpu 1 -count 6 ./internal/provenance/ >new.txt
//	benchstat new.txt
package provenance

import (
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// CallFrame is one execution on a call stack, the execution itself first.
type CallFrame struct {
	Entry     uint64 `json:"entry"`
	Exit      uint64 `json:"exit"` // 0 if not exited when written
	FID       uint32 `json:"fid"`
	Func      string `json:"func"`
	EventID   string `json:"event_id"`
	IsAnomaly bool   `json:"is_anomaly"`
}

// CounterEvent is a counter sample taken during an execution.
type CounterEvent struct {
	CounterIdx   uint32 `json:"counter_idx"`
	CounterName  string `json:"counter_name"`
	CounterValue uint64 `json:"counter_value"`
	PID          uint32 `json:"pid"`
	RID          uint32 `json:"rid"`
	TID          uint32 `json:"tid"`
	TS           uint64 `json:"ts"`
}

// FuncStats is the statistics of a function's runtime at detection time.
type FuncStats struct {
	Accumulate float64 `json:"accumulate"`
	Count      float64 `json:"count"`
	Kurtosis   float64 `json:"kurtosis"`
	Maximum    float64 `json:"maximum"`
	Mean       float64 `json:"mean"`
	Minimum    float64 `json:"minimum"`
	Skewness   float64 `json:"skewness"`
	Stddev     float64 `json:"stddev"`
}

// FuncStatsOf converts running moments to the record form. Accumulate is the
// sum of the values (n * mean).
func FuncStatsOf(m stats.Moments) FuncStats {
	return FuncStats{
		Accumulate: m.N * m.Mean, Count: m.N, Kurtosis: m.Kurtosis(), Maximum: m.Max,
		Mean: m.Mean, Minimum: m.Min, Skewness: m.Skewness(), Stddev: m.Stddev(),
	}
}

// GPULocation is the GPU context of a GPU execution.
type GPULocation struct {
	Context uint32 `json:"context"`
	Device  uint32 `json:"device"`
	Stream  uint32 `json:"stream"`
	Thread  uint32 `json:"thread"`
}

// GPUParent is the CPU execution that launched a GPU execution.
type GPUParent struct {
	EventID   string      `json:"event_id"`
	TID       uint32      `json:"tid"`
	CallStack []CallFrame `json:"call_stack"`
}

// WindowExec is one execution in an event window.
type WindowExec struct {
	Entry         uint64 `json:"entry"`
	Exit          uint64 `json:"exit"`
	FID           uint32 `json:"fid"`
	Func          string `json:"func"`
	EventID       string `json:"event_id"`
	ParentEventID string `json:"parent_event_id"`
	IsAnomaly     bool   `json:"is_anomaly"`
}

// CommRecord is one message in an event window.
type CommRecord struct {
	Type        string `json:"type"` // "SEND" or "RECV"
	PID         uint32 `json:"pid"`
	RID         uint32 `json:"rid"`
	TID         uint32 `json:"tid"`
	Src         uint32 `json:"src"`
	Tar         uint32 `json:"tar"`
	Bytes       uint64 `json:"bytes"`
	Tag         uint32 `json:"tag"`
	Timestamp   uint64 `json:"timestamp"`
	ExecdataKey string `json:"execdata_key"`
}

// EventWindow is the executions and messages around an execution on its thread.
type EventWindow struct {
	ExecWindow []WindowExec `json:"exec_window"`
	CommWindow []CommRecord `json:"comm_window"`
}

// Exec is an anomaly or a sampled normal execution (collections anomalies and
// normalexecs). EventID "<rank>:<io_step>:<idx>" is unique per program, so
// (pid, event_id) identifies a record and makes writes idempotent.
type Exec struct {
	CallStack        []CallFrame    `json:"call_stack"`
	CounterEvents    []CounterEvent `json:"counter_events"`
	Entry            uint64         `json:"entry"`
	Exit             uint64         `json:"exit"`
	EventID          string         `json:"event_id"`
	FID              uint32         `json:"fid"`
	Func             string         `json:"func"`
	FuncStats        FuncStats      `json:"func_stats"`
	IsGPUEvent       bool           `json:"is_gpu_event"`
	GPULocation      *GPULocation   `json:"gpu_location"`
	GPUParent        *GPUParent     `json:"gpu_parent"`
	PID              uint32         `json:"pid"`
	RID              uint32         `json:"rid"`
	TID              uint32         `json:"tid"`
	RuntimeExclusive uint64         `json:"runtime_exclusive"`
	RuntimeTotal     uint64         `json:"runtime_total"`
	// IOStep is the io_step the execution ran in: the step of the frame
	// holding its exit event; IOStepTStart and IOStepTEnd are that step's
	// window (µs).
	IOStep       uint64 `json:"io_step"`
	IOStepTStart uint64 `json:"io_step_tstart"`
	IOStepTEnd   uint64 `json:"io_step_tend"`
	// LabelledIOStep is the io_step the execution was labelled in: later
	// than IOStep when its model was too young to judge it at once. Absent
	// (0) in records of other tools and of earlier versions.
	LabelledIOStep  uint64      `json:"labelled_io_step,omitempty"`
	EventWindow     EventWindow `json:"event_window"`
	OutlierScore    float64     `json:"outlier_score"`
	OutlierSeverity float64     `json:"outlier_severity"`
	Hostname        string      `json:"hostname,omitempty"`
	Algorithm       string      `json:"algorithm,omitempty"`
	// Explanation says how far out the execution is (nil with Chimbuko's
	// rules, and in records of other tools).
	Explanation *Explanation `json:"explanation,omitempty"`
	// FinalLabel is set by readers that relabel anomalies with the run's
	// final models (FinalAnomaly): FinalAnomalyLabel or FinalUnflagged. It
	// is not stored.
	FinalLabel string `json:"final_label,omitempty"`
}

// Explanation is how far out an execution is against its model, at the
// time it was labelled. Times are µs.
type Explanation struct {
	Key          string  `json:"key"`           // the model key
	Value        float64 `json:"value"`         // the runtime the model is built on
	NaturalMin   float64 `json:"natural_min"`   // smallest runtime of the natural range
	NaturalMax   float64 `json:"natural_max"`   // largest runtime of the natural range
	LowThreshold float64 `json:"low_threshold"` // runtimes below it are flagged (unless slow-only)
	Threshold    float64 `json:"threshold"`     // runtimes beyond it are flagged
	Ratio        float64 `json:"ratio"`         // Value / NaturalMax
	P99          float64 `json:"p99"`           // the model's 99th percentile
	LogSigmas    float64 `json:"log_sigmas"`    // distance from the mean in σ of log runtime
	Excess       float64 `json:"excess"`        // Value - NaturalMax
	Text         string  `json:"text"`          // all of it in words
	// Baseline is set when the execution was flagged against a baseline
	// run (kipimo run --baseline): it lies beyond the baseline's bound, in a
	// slow mode that run did not have. The end-of-run relabelling keeps it
	// when it lies in the mode the run's final model finds against the
	// baseline.
	Baseline *BaselineEvidence `json:"baseline,omitempty"`
}

// BaselineEvidence is why an execution was flagged against a baseline run:
// its key's calls beyond Bound occur at a rate significantly above the
// baseline's own (one-sided binomial test, PValue against 5 times the
// baseline's smoothed rate (BaselineBeyond+1)/(BaselineCalls+2), the
// margin two clean runs differ by).
type BaselineEvidence struct {
	Source         string  `json:"source"`          // the baseline, as named
	Bound          float64 `json:"bound"`           // µs: the baseline's natural threshold
	BaselineCalls  uint64  `json:"baseline_calls"`  // the key's calls in the baseline
	BaselineBeyond uint64  `json:"baseline_beyond"` // of which beyond Bound
	Calls          uint64  `json:"calls"`           // the key's calls on this rank so far
	Beyond         uint64  `json:"beyond"`          // of which beyond Bound
	PValue         float64 `json:"p_value"`         // of the test, before the correction for the number of keys
}

// Metadata is one metadata entry of a rank and thread (collection metadata).
type Metadata struct {
	Descr string `json:"descr"`
	PID   uint32 `json:"pid"`
	RID   uint32 `json:"rid"`
	TID   uint32 `json:"tid"`
	Value string `json:"value"`
}

// GlobalFuncStats is the run's final statistics of one function (collection
// func_stats), written by the parameter server at the end of a run.
type GlobalFuncStats struct {
	PID       uint32    `json:"pid"`
	FID       uint32    `json:"fid"`
	Func      string    `json:"func"`
	Stats     FuncStats `json:"stats"`
	Anomalies uint64    `json:"anomalies"`
	// NaturalRange is the final model's natural range of the key, as the
	// thresholds below and above which runtimes are anomalies (absent with
	// Chimbuko's rules): the end-of-run relabelling reads it. With a
	// baseline (kipimo run --baseline), the range of a key with a new slow
	// mode against it ends where the mode starts (at or beyond the
	// baseline's bound).
	NaturalRange *Range `json:"natural_range,omitempty"`
	// Recurring is the key's recurring slow mode, when it has one: natural
	// runtimes beyond a gap above the body of its runtimes that hold at
	// least 5% of its time (docs/detection.md).
	Recurring *RecurringMode `json:"recurring,omitempty"`
	// NaturalHist is the key's final natural-range histogram (absent with
	// Chimbuko's rules): a later run compared with this one as its
	// baseline (kipimo run --baseline) reads its quantiles and modes.
	NaturalHist *stats.TailHist `json:"natural_hist,omitempty"`
	// IOSteps is how many io_steps the run had (the same on every record
	// of a run; 0 when unknown): calls per io_step are Stats.Count over it.
	IOSteps uint64 `json:"io_steps,omitempty"`
}

// RecurringMode is a recurring slow mode of a model key (a function, or a
// call path): reported whether or not any of its executions were flagged.
type RecurringMode struct {
	// Calls is how many executions the mode holds, CallsFraction their
	// share of the key's executions.
	Calls         uint64  `json:"calls"`
	CallsFraction float64 `json:"calls_fraction"`
	// TypicalUs is the mode's median runtime, LowUs and HighUs its
	// smallest and largest (µs).
	TypicalUs float64 `json:"typical_us"`
	LowUs     float64 `json:"low_us"`
	HighUs    float64 `json:"high_us"`
	// TimeShare is the mode's share of the key's total runtime.
	TimeShare float64 `json:"time_share"`
	// FirstIOStep is the first io_step whose statistics carried a runtime
	// in the mode; Ranks the ranks that sent some (at most 64, the
	// smallest).
	FirstIOStep uint64   `json:"first_io_step"`
	Ranks       []uint32 `json:"ranks"`
}

// GlobalCounterStats is the run's final statistics of one counter (collection
// counter_stats).
type GlobalCounterStats struct {
	PID     uint32    `json:"pid"`
	Counter string    `json:"counter"`
	Stats   FuncStats `json:"stats"`
}

// ThreadProfile is a detector's profile of one thread, published at the end of
// a run (and every K steps when asked), from which the summary writer builds TAU
// profiles. Times are microseconds.
//
// A profile too large for one message (a thread with many thousands of call
// paths) is published in Parts parts, numbered by Part from 0, each with
// some of the timers and of Overflow; part 0 has the counters and the
// metadata.
// ThreadProfile.Join puts them back together.
type ThreadProfile struct {
	PID      uint32            `json:"pid"`
	Rank     uint32            `json:"rank"`
	TID      uint32            `json:"tid"`
	Step     uint64            `json:"io_step"` // last step covered
	Final    bool              `json:"final"`
	Timers   []TimerProfile    `json:"timers"` // flat functions and call paths "a => b"
	Counters []CounterProfile  `json:"counters"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// FirstTS and LastTS are the thread's first and last event timestamps
	// so far: its wall time, the inclusive time of TAU's ".TAU application"
	// root. Zero when unknown.
	FirstTS uint64 `json:"first_ts,omitempty"`
	LastTS  uint64 `json:"last_ts,omitempty"`
	// Overflow holds, per function, the part of its flat timer that ran
	// below another call with no call path of its own (the call-path table
	// was full): counted in the flat timer, never a top-level call.
	Overflow []TimerProfile `json:"overflow,omitempty"`
	// Part and Parts number the parts of a split profile (Parts 0 or 1:
	// not split).
	Part  int `json:"part,omitempty"`
	Parts int `json:"parts,omitempty"`
}

// Join returns the profile whose parts are parts (every part of one
// thread's profile at one step, in any order), or an error naming what is
// missing or mixed.
func Join(parts []ThreadProfile) (ThreadProfile, error) {
	if len(parts) == 0 {
		return ThreadProfile{}, fmt.Errorf("join thread profile: no parts")
	}
	n := max(parts[0].Parts, 1)
	got := make([]*ThreadProfile, n)
	for i := range parts {
		p := &parts[i]
		if p.PID != parts[0].PID || p.Rank != parts[0].Rank || p.TID != parts[0].TID || p.Step != parts[0].Step || p.Final != parts[0].Final || max(p.Parts, 1) != n {
			return ThreadProfile{}, fmt.Errorf("join thread profile %s: part %s is of another profile", parts[0].Key(), p.Key())
		}
		if p.Part < 0 || p.Part >= n || got[p.Part] != nil {
			return ThreadProfile{}, fmt.Errorf("join thread profile %s: part %d of %d out of range or repeated", parts[0].Key(), p.Part, n)
		}
		got[p.Part] = p
	}
	for i, p := range got {
		if p == nil {
			return ThreadProfile{}, fmt.Errorf("join thread profile %s: part %d of %d missing", parts[0].Key(), i, n)
		}
	}
	out := *got[0]
	out.Part, out.Parts = 0, 0
	out.Timers, out.Overflow = nil, nil
	for _, p := range got {
		out.Timers = append(out.Timers, p.Timers...)
		out.Overflow = append(out.Overflow, p.Overflow...)
	}
	return out, nil
}

// TimerProfile is one flat function or call path of a thread profile.
type TimerProfile struct {
	Name           string  `json:"name"` // "f" or "main => f"
	Group          string  `json:"group,omitempty"`
	Calls          uint64  `json:"calls"`
	Subrs          uint64  `json:"subrs"`
	Inclusive      float64 `json:"inclusive"`
	Exclusive      float64 `json:"exclusive"`
	SumSqInclusive float64 `json:"sumsq_inclusive"`
	SumSqExclusive float64 `json:"sumsq_exclusive"`
}

// CounterProfile is one counter (TAU user event) of a thread profile.
type CounterProfile struct {
	Name   string  `json:"name"`
	Count  uint64  `json:"count"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
	SumSqr float64 `json:"sumsqr"`
}

// Final labels of an anomaly after the end-of-run relabelling.
const (
	FinalAnomalyLabel = "anomaly"
	FinalUnflagged    = "unflagged"
)

// FinalRanges collects the natural ranges of func_stats records by model
// key (Func), for FinalAnomaly; records without one are left out.
func FinalRanges(fs []GlobalFuncStats) map[string]Range {
	out := map[string]Range{}
	for _, f := range fs {
		if f.NaturalRange != nil {
			out[f.Func] = *f.NaturalRange
		}
	}
	return out
}

// Range is a model's natural range as thresholds: runtimes below Low or
// above High are outside it.
type Range struct {
	Low  float64 `json:"low"`
	High float64 `json:"high"`
}

// FinalAnomaly reports whether anomaly e is still one against the final
// models' natural ranges by model key (see Explanation): its value must lie
// outside its key's range. Records without an explanation, or of a key
// ranges lacks, stay anomalies. With a baseline run, the range of a key with
// a new slow mode ends where the mode starts (see GlobalFuncStats), so that
// the executions in the mode stand though the run's own range takes it in.
func FinalAnomaly(e *Exec, ranges map[string]Range) bool {
	if e.Explanation == nil {
		return true
	}
	r, ok := ranges[e.Explanation.Key]
	return !ok || e.Explanation.Value > r.High || e.Explanation.Value < r.Low
}
