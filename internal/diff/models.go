package diff

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
)

// KindLive is the kind of a running run's side: its models merged so far,
// from its pserver.
const KindLive = "live"

// QuantityModels is ModelResult.Quantity: per-key models, not per-thread
// values.
const QuantityModels = "models"

// ModelSortRule is the documented sort order of ModelResult.Functions.
const ModelSortRule = "extra time: B's time less what its calls took at A's mean per call, largest first; ties by name"

// ModelTestName names the tests of a comparison of models.
const ModelTestName = "one-sided binomial tests of B's calls beyond A's natural range and above A's p99, and of its calls per io_step, against A's rates (Bonferroni over the functions)"

// ModelSide is one side of a comparison of models (CompareModels): a run's
// final models by key, or a running run's merged so far.
type ModelSide struct {
	// Label is how the user named the source.
	Label string
	// Ref holds the models as a baseline does: per key its calls, time and
	// natural-range histogram (none from a TAU profile), and the run's
	// io_steps.
	Ref *baseline.Reference
	// Live is the running run's state, nil for a finished one.
	Live *Live
}

// Kind is KindLive for a running run, else its reference's kind.
func (s *ModelSide) Kind() string {
	if s.Live != nil {
		return KindLive
	}
	return s.Ref.Kind
}

// ModelResult is a comparison of two runs' models: per key both have, B
// against A as a run against its baseline (baseline.Compare).
type ModelResult struct {
	A        ModelSideInfo `json:"a"`
	B        ModelSideInfo `json:"b"`
	Quantity string        `json:"quantity"`
	// Compared says what was compared (less with a TAU profile).
	Compared string `json:"compared"`
	// Test names the tests; Alpha is their level over all functions, Level
	// each function's (Alpha over the functions tested).
	Test  TestInfo `json:"test"`
	Level float64  `json:"level"`
	Sort  string   `json:"sort"`
	// Count is the number of functions both sides have; Functions may hold
	// fewer (Top).
	Count     int                       `json:"count"`
	Functions []baseline.FuncComparison `json:"functions"`
	// OnlyA and OnlyB are the functions only one side has.
	OnlyA []string `json:"only_a"`
	OnlyB []string `json:"only_b"`
}

// ModelSideInfo describes a side of a ModelResult.
type ModelSideInfo struct {
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// Live is whether the run is still going: its models are those merged
	// so far.
	Live bool `json:"live"`
	// Run, Status, IOStep, Shard and Shards are a live side's (Live).
	Run    string  `json:"run,omitempty"`
	Status string  `json:"status,omitempty"`
	IOStep *uint64 `json:"io_step,omitempty"`
	Shard  *int    `json:"shard,omitempty"`
	Shards *int    `json:"shards,omitempty"`
	// IOSteps is the run's io_steps (so far); 0 when unknown.
	IOSteps uint64 `json:"io_steps"`
	// Functions is the number of model keys.
	Functions int `json:"functions"`
}

func modelInfo(s *ModelSide) ModelSideInfo {
	si := ModelSideInfo{Source: s.Label, Kind: s.Kind(), IOSteps: s.Ref.IOSteps, Functions: len(s.Ref.Keys)}
	if l := s.Live; l != nil {
		si.Live, si.Run, si.Status, si.IOStep, si.IOSteps = true, l.Run, l.Status, l.IOStep, l.IOSteps
		shard, shards := l.Shard, l.Shards
		si.Shard, si.Shards = &shard, &shards
	}
	return si
}

// CompareModels compares b's models with a's, per key both have, as a run
// is compared with its baseline: time and calls per io_step, p50 and p99,
// and new slow modes, tested at alpha over the keys (baseline.DefaultAlpha
// when 0). Rows are sorted by B's extra time.
func CompareModels(a, b *ModelSide, alpha float64) (*ModelResult, error) {
	if a == nil || b == nil || a.Ref == nil || b.Ref == nil {
		return nil, errors.New("diff: both sides need models")
	}
	if alpha == 0 {
		alpha = baseline.DefaultAlpha
	}
	if !(alpha > 0 && alpha < 1) {
		return nil, fmt.Errorf("significance level %v: want a number between 0 and 1", alpha)
	}
	cur := make([]baseline.Current, 0, len(b.Ref.Keys))
	for _, n := range b.Ref.Names() {
		k := b.Ref.Keys[n]
		cur = append(cur, baseline.Current{Name: n, Calls: k.Calls, TotalUs: k.TotalUs, Hist: k.Hist})
	}
	rep := baseline.Compare(a.Ref, cur, b.Ref.IOSteps, alpha)
	res := &ModelResult{A: modelInfo(a), B: modelInfo(b), Quantity: QuantityModels, Compared: rep.Compared,
		Test: TestInfo{Name: ModelTestName, Alpha: alpha}, Level: rep.Level, Sort: ModelSortRule,
		Count: len(rep.Functions), Functions: rep.Functions, OnlyA: rep.Missing, OnlyB: rep.Absent}
	if b.Ref.Kind == baseline.KindTAU && a.Ref.Kind != baseline.KindTAU {
		res.Compared = "mean time per call and calls only: a TAU profile has no histograms and no io_steps"
	}
	return res, nil
}

// Top keeps the first n rows (all for n <= 0).
func (r *ModelResult) Top(n int) {
	if n > 0 && len(r.Functions) > n {
		r.Functions = r.Functions[:n]
	}
}

func describeModelSide(s ModelSideInfo) string {
	steps := "io_steps unknown"
	if s.IOSteps > 0 {
		steps = count(int(s.IOSteps), "io_step")
	}
	if !s.Live {
		return fmt.Sprintf("%s (%s, %s, %s)", s.Source, s.Kind, steps, count(s.Functions, "function"))
	}
	at := "before its first io_step"
	if s.IOStep != nil {
		at = "at io_step " + strconv.FormatUint(*s.IOStep, 10)
	}
	d := fmt.Sprintf("%s (live run %s, %s: the models merged so far, %s", s.Source, s.Run, at, count(s.Functions, "function"))
	if s.Status != "live" { // the pserver has stopped taking syncs
		d += "; the pserver says the run is " + s.Status
	}
	if s.Shards != nil && *s.Shards > 1 {
		d += fmt.Sprintf("; shard %d of %d: only its functions", *s.Shard, *s.Shards)
	}
	return d + ")"
}

// count is "1 thread", "16 threads".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// WriteModelsText prints r as a table: a header naming the sides (a live
// one with the io_step it is at), what was compared and the sort rule,
// then one line per function with A's and B's mean time per call, B's time
// and calls per io_step over A's, its extra time, p99 in A and B, the
// p-value of a new slow mode and what is significantly worse, and the
// functions only one side has.
func WriteModelsText(w io.Writer, r *ModelResult) error {
	fmt.Fprintf(w, "A: %s\n", describeModelSide(r.A))
	fmt.Fprintf(w, "B: %s\n", describeModelSide(r.B))
	fmt.Fprintf(w, "B's models against A's, as a run against its baseline: %s; significant below %s per function (%s over all)\n",
		r.Compared, strconv.FormatFloat(r.Level, 'g', 2, 64), strconv.FormatFloat(r.Test.Alpha, 'g', -1, 64))
	fmt.Fprintf(w, "Sorted by B's extra time: its time less what its calls took at A's mean per call\n")
	fmt.Fprintf(w, "Showing %d of %d functions in both\n", len(r.Functions), r.Count)
	if len(r.Functions) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "mean A\tmean B\tB/A\ttime/io_step B/A\tcalls/io_step B/A\textra\tp99 A\tp99 B\tmode p\tchange\t")
		for _, f := range r.Functions {
			p99a, p99b, p := "-", "-", "-"
			if f.BaselineP99 > 0 {
				p99a, p99b = formatMicros(f.BaselineP99), formatMicros(f.P99)
			}
			if f.NewMode != nil {
				p = formatP(f.NewMode.PValue)
			}
			change := "same"
			if len(f.Slower) > 0 {
				change = strings.Join(f.Slower, ", ")
			}
			extra := formatMicros(f.ExtraUs)
			if f.ExtraUs > 0 {
				extra = "+" + extra
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t  %s\n", formatMicros(f.BaselineMeanUs), formatMicros(f.MeanUs),
				formatRatio(f.MeanRatio), formatRatio(f.TimePerStepRatio), formatRatio(f.CallsRatio), extra, p99a, p99b, p, change, f.Func)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, only := range []struct {
		side  string
		names []string
	}{{"A", r.OnlyA}, {"B", r.OnlyB}} {
		if len(only.names) > 0 {
			fmt.Fprintf(w, "Only in %s: %s\n", only.side, listShort(only.names, 10))
		}
	}
	return nil
}

// formatRatio prints a ratio with 3 significant digits, "-" for none (0).
func formatRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// listShort joins the first n of names, saying how many more there are.
func listShort(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// WriteModelsJSON prints r as one indented JSON document.
func WriteModelsJSON(w io.Writer, r *ModelResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}
