package run

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/tauexport"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// tauStreamBytesPerEvent is what TAU's ADIOS2 plugin sends per function
// event: [pid, rank, tid, entry|exit, timer, timestamp] as six uint64s.
const tauStreamBytesPerEvent = 48

// Summary is what a run reports at its end (`kipimo run --json` prints it).
type Summary struct {
	RunID     string `json:"run_id"`
	Algorithm string `json:"algorithm"`
	Ranks     int    `json:"ranks"`

	// Frames and Events are what the input published; FramesProcessed the
	// frames the detectors processed (bad frames are counted apart).
	Frames          int    `json:"frames"`
	FramesProcessed uint64 `json:"frames_processed"`
	Events          int64  `json:"events"`
	Executions      uint64 `json:"executions"`
	Anomalies       uint64 `json:"anomalies"`
	// AnomaliesFinal are the stored anomalies that stand after the
	// end-of-run relabelling (Anomalies were flagged live); absent with
	// Chimbuko's rules, which do not relabel.
	AnomaliesFinal *uint64 `json:"anomalies_final,omitempty"`
	// SummarisedCalls are calls the event library summarised per io_step
	// instead of streaming them (in the profiles, not executions);
	// SourceDroppedCalls calls it dropped whole (full rings).
	SummarisedCalls    uint64 `json:"summarised_calls,omitempty"`
	SourceDroppedCalls uint64 `json:"source_dropped_calls,omitempty"`
	// Stored counts the records in the provenance store per collection.
	Stored map[provenance.Kind]int64 `json:"stored"`
	// Score compares the anomalies with the injected ground truth
	// (synthetic runs only).
	Score *Score `json:"score,omitempty"`
	// TopFunctions are the functions whose anomalies lost the most time,
	// costliest first.
	TopFunctions []TopFunction `json:"top_functions"`
	// Recurring are the functions with a recurring slow mode: natural
	// runtimes beyond a gap above the body of their runtimes that hold at
	// least 5% of their time, whether or not any were flagged
	// (docs/detection.md).
	Recurring []pserver.Recurring `json:"recurring"`
	// Culprits are the ranks and functions where waits began, ordered by
	// the time they cost the job (their own excess and the waits they
	// caused); OutlierRanks the ranks whose time in a function stood out
	// from their peers', with the io_steps (docs/detection.md). The whole
	// analysis, with its bursts, is in the run's culprits.json.
	Culprits     []pserver.CulpritRow `json:"culprits"`
	OutlierRanks []pserver.OutlierRow `json:"outlier_ranks"`
	// Baseline compares the run with its baseline (--baseline), per
	// function, by extra time; absent without one.
	Baseline *baseline.Report `json:"baseline,omitempty"`

	EventsPerSecond float64 `json:"events_per_s"`
	DetectSeconds   float64 `json:"detect_seconds"`
	WallSeconds     float64 `json:"wall_seconds"`
	// DrainSeconds is the time from the detectors' end to everything being
	// in the provenance store (records flushed, final statistics, the
	// provenance stream consumed); ProfileSeconds the time spent building
	// and writing the TAU profiles (and TAUdb trial).
	DrainSeconds   float64 `json:"drain_seconds,omitempty"`
	ProfileSeconds float64 `json:"profile_seconds,omitempty"`

	// RawBytes is the size of every frame published (binary encoding);
	// StoredBytes the bytes the provenance store takes on disk, its log
	// checkpointed; Reduction their ratio. ReductionVsTAU compares the
	// store with the same events as TAU's ADIOS2 plugin streams them (48
	// bytes per event: six uint64s).
	RawBytes       int64   `json:"raw_frame_bytes"`
	StoredBytes    int64   `json:"stored_bytes"`
	Reduction      float64 `json:"reduction_factor"`
	ReductionVsTAU float64 `json:"reduction_factor_vs_tau_stream"`
	// NATSBytes is the embedded NATS server's data, kept after the run
	// with KeepNATS (0 otherwise: it is deleted).
	NATSBytes int64 `json:"kept_nats_bytes,omitempty"`
	// KeptExecutions are the executions the store keeps (anomalies and
	// the normal executions sampled or kept in anomalies' windows);
	// KeptFraction their share of the input's executions.
	// BytesPerAnomaly and BytesPerInputEvent divide the store's size by
	// the anomalies and by the input's events: what finding an anomaly
	// costs, and what a longer trace of the same kind will take.
	KeptExecutions     int64   `json:"kept_executions"`
	KeptFraction       float64 `json:"kept_fraction"`
	BytesPerAnomaly    float64 `json:"stored_bytes_per_anomaly"`
	BytesPerInputEvent float64 `json:"stored_bytes_per_input_event"`
	// TraceInput reports on the trace read with --input: what its reader
	// read and what of it the frames do not carry (trace inputs only).
	TraceInput *TraceInput `json:"trace_input,omitempty"`

	// Faults: everything the pipeline rejected, dropped or repaired.
	BadFrames uint64 `json:"bad_frames"`
	// MissingSteps are io_steps that never reached a detector: gaps in a
	// rank's sequence of frames (per rank: kipimo_ad_missing_steps_total).
	MissingSteps   uint64 `json:"missing_steps"`
	UnmatchedExits uint64 `json:"unmatched_exits"`
	OpenAtEnd      uint64 `json:"open_at_end"`
	DroppedRecords uint64 `json:"dropped_records"`
	SyncFailures   uint64 `json:"sync_failures"`
	BadProvenance  int64  `json:"bad_provenance_messages"`
	// Backpressure is how long the input waited for detectors that fell
	// behind, and how far behind they fell.
	Backpressure *Backpressure `json:"backpressure"`
	// Live reports on the command of a live run (--exec) and on the event
	// library in its processes.
	Live *LiveReport `json:"live,omitempty"`

	Store string `json:"provenance_store"`
	// ProfilesDir is empty when no rank streamed an io_step.
	ProfilesDir string `json:"tau_profiles"`
	TaudbTrial  int64  `json:"taudb_trial,omitempty"`
	Truth       string `json:"truth,omitempty"`
	Dashboard   string `json:"dashboard"`
	// DashboardServed says how long Dashboard answers: DashboardDuringRun
	// (it stopped with the run) or DashboardUntilInterrupted (--keep-serving).
	DashboardServed string `json:"dashboard_served"`
	// Explore are commands to look at the results.
	Explore []string `json:"explore"`
	// Interrupted names the signal that ended the run early (SIGINT for
	// Ctrl-C, SIGTERM): the summary covers what the run saw until then.
	Interrupted string `json:"interrupted,omitempty"`
}

// setInterrupted records the signal that ended the run early, if any.
func (s *Summary) setInterrupted(sig os.Signal) {
	if sig != nil {
		s.Interrupted = SignalName(sig)
	}
}

// SignalName names a signal as kill -l does, with the SIG prefix: SIGINT,
// SIGTERM.
func SignalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// TraceInput is what the reader of a trace input read.
type TraceInput struct {
	Format string `json:"format"`
	// InputEvents counts the events or records read from the trace;
	// Executions the completed calls in it.
	InputEvents int `json:"input_events"`
	Executions  int `json:"executions"`
	// Losses counts, per kind, what the trace held that the frames do not
	// carry as it was (unclosed spans, instants, overlaps moved...).
	Losses replay.Losses `json:"losses"`
}

// Backpressure reports the input's flow control: the input of a rank waits
// while that rank's detector has Bound frames published and not yet taken,
// so a detector that falls behind slows the input instead of making the
// pipeline buffer without limit.
type Backpressure struct {
	// Bound is the most frames a rank may have in flight (--max-lag).
	Bound int `json:"bound_frames"`
	// HeldSeconds is the total time the input waited, HeldFrames how many
	// frames had to wait.
	HeldSeconds float64 `json:"input_held_seconds"`
	HeldFrames  int     `json:"held_frames"`
	// MaxBehind is the most frames a rank's detector was behind its input
	// (never more than Bound), first reached by MaxBehindRank.
	MaxBehind     int    `json:"max_behind_steps"`
	MaxBehindRank uint32 `json:"max_behind_rank"`
	// SlowestRank is the rank the input waited for longest in total, for
	// SlowestRankHeldSeconds.
	SlowestRank            uint32  `json:"slowest_rank"`
	SlowestRankHeldSeconds float64 `json:"slowest_rank_held_seconds"`
}

// TopFunction is a function of the summary's top list: its stored
// anomalies and the time they lost beyond its natural maximum.
type TopFunction struct {
	Func  string `json:"func"`
	Count int64  `json:"count"`
	// TimeLostUs is the sum of the anomalies' explanation.excess (those
	// flagged as too long; anomalies without an explanation, as with
	// Chimbuko's rules, count for none).
	TimeLostUs float64 `json:"time_lost_us"`
}

// topFunctionsN is the length of the summary's top list.
const topFunctionsN = 5

// execSource streams stored executions (the provenance store).
type execSource interface {
	Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error
}

// topFunctions reads the stored anomalies and returns the n functions that
// lost the most time, ties broken by more anomalies, then by name. With
// stand (the final models' labels) only the anomalies that stand after the
// end-of-run relabelling count, as in the summary's anomaly count.
func topFunctions(ctx context.Context, src execSource, n int, stand func(*provenance.Exec) bool) ([]TopFunction, error) {
	byFunc := map[string]*TopFunction{}
	err := src.Each(ctx, provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.NoLimit}, func(e provenance.Exec) error {
		if stand != nil && !stand(&e) {
			return nil
		}
		t := byFunc[e.Func]
		if t == nil {
			t = &TopFunction{Func: e.Func}
			byFunc[e.Func] = t
		}
		t.Count++
		if x := e.Explanation; x != nil && x.Excess > 0 {
			t.TimeLostUs += x.Excess
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	top := make([]TopFunction, 0, len(byFunc))
	for _, t := range byFunc {
		top = append(top, *t)
	}
	slices.SortFunc(top, func(a, b TopFunction) int {
		return cmp.Or(cmp.Compare(b.TimeLostUs, a.TimeLostUs), cmp.Compare(b.Count, a.Count), strings.Compare(a.Func, b.Func))
	})
	return top[:min(n, len(top))], nil
}

func (p *Pipeline) summarize(ctx context.Context, st []ad.Stats, truthFn func() []workload.Truth, in publish.Counts, inputExecs int, detect, wall time.Duration) (*Summary, error) {
	cfg := p.cfg
	var total ad.Stats
	for _, s := range st {
		total.Add(s)
	}
	sum := &Summary{
		RunID: cfg.RunID, Algorithm: cfg.Detector.Algorithm, Ranks: len(st),
		Frames: in.Frames, FramesProcessed: total.Frames, Events: int64(in.Events), Executions: total.Executions, Anomalies: total.Anomalies,
		SummarisedCalls: total.SummarisedCalls, SourceDroppedCalls: total.SourceDroppedCalls,
		Stored:          map[provenance.Kind]int64{},
		DetectSeconds:   detect.Seconds(),
		WallSeconds:     wall.Seconds(),
		RawBytes:        in.Bytes,
		BadFrames:       total.BadFrames,
		MissingSteps:    total.MissingSteps,
		UnmatchedExits:  total.UnmatchedExits,
		OpenAtEnd:       total.OpenAtEnd,
		DroppedRecords:  total.DroppedRecords,
		SyncFailures:    total.SyncFailures,
		BadProvenance:   p.prov.Stats().Bad,
		Store:           cfg.path("provenance.db"),
		ProfilesDir:     cfg.path("profiles"),
		Dashboard:       p.DashboardURL(),
		DashboardServed: DashboardDuringRun,
	}
	if detect > 0 {
		sum.EventsPerSecond = float64(in.Events) / detect.Seconds()
	}
	for _, kind := range provenance.Kinds {
		n, err := p.store.Count(ctx, provenance.Query{Kind: kind})
		if err != nil {
			return nil, fmt.Errorf("count stored %s: %w", kind, err)
		}
		sum.Stored[kind] = n
	}
	top, err := topFunctions(ctx, p.store, topFunctionsN, p.finalLabel())
	if err != nil {
		return nil, fmt.Errorf("top functions: %w", err)
	}
	sum.TopFunctions = top
	p.ps.View(func(st *pserver.State) { sum.Recurring = st.Recurring() })
	if err := p.addCulprits(sum); err != nil {
		return nil, err
	}
	sum.Baseline = p.compareBaseline()
	if sum.StoredBytes, err = p.store.DiskUsage(ctx); err != nil {
		return nil, err
	}
	if cfg.KeepNATS && p.ns != nil {
		sum.NATSBytes = dirBytes(cfg.path("nats"))
	}
	if sum.StoredBytes > 0 {
		sum.Reduction = float64(sum.RawBytes) / float64(sum.StoredBytes)
		sum.ReductionVsTAU = float64(sum.Events*tauStreamBytesPerEvent) / float64(sum.StoredBytes)
	}
	sum.KeptExecutions = sum.Stored[provenance.KindAnomalies] + sum.Stored[provenance.KindNormalExecs]
	if inputExecs > 0 {
		sum.KeptFraction = float64(sum.KeptExecutions) / float64(inputExecs)
	}
	if sum.Anomalies > 0 {
		sum.BytesPerAnomaly = float64(sum.StoredBytes) / float64(sum.Anomalies)
	}
	if sum.Events > 0 {
		sum.BytesPerInputEvent = float64(sum.StoredBytes) / float64(sum.Events)
	}
	if in := p.input; in != nil {
		l := in.Losses
		if l == nil {
			l = replay.Losses{}
		}
		sum.TraceInput = &TraceInput{Format: cfg.InputFormat, InputEvents: in.InputEvents, Executions: in.Executions, Losses: l}
	}
	if n, ok, err := p.standingAnomalies(ctx); err != nil {
		return nil, err
	} else if ok {
		sum.AnomaliesFinal = &n
	}
	if truthFn != nil {
		truth := truthFn()
		f, err := os.Create(cfg.path("truth.jsonl"))
		if err != nil {
			return nil, fmt.Errorf("write ground truth: %w", err)
		}
		werr := workload.WriteTruth(f, truth)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, fmt.Errorf("write ground truth: %w", werr)
		}
		sum.Truth = cfg.path("truth.jsonl")
		anomalies, err := p.allAnomalies(ctx)
		if err != nil {
			return nil, err
		}
		sc := ScoreFinal(truth, anomalies, p.finalLabel())
		sum.Score = &sc
	}
	if len(st) > 0 {
		profStart := time.Now()
		id, err := p.writeProfiles(ctx)
		if err != nil {
			return nil, err
		}
		sum.ProfileSeconds = time.Since(profStart).Seconds()
		sum.TaudbTrial = int64(id)
	} else {
		// No rank streamed anything (a command that is not instrumented,
		// or interrupted at once): there is no profile to write.
		sum.ProfilesDir = ""
	}
	sum.Explore = []string{
		fmt.Sprintf("kipimo query list --store %s --sort outlier_score --desc --limit 20", sum.Store),
		fmt.Sprintf("kipimo query agg --store %s --by rank", sum.Store),
	}
	switch {
	case sum.TaudbTrial != 0:
		sum.Explore = append(sum.Explore, fmt.Sprintf("kipimo taudb show --dsn $KIPIMO_TAUDB_DSN %d", sum.TaudbTrial))
	case sum.ProfilesDir != "":
		// taudb load reads a run's directory, named after the run.
		sum.Explore = append(sum.Explore, fmt.Sprintf("kipimo taudb load --dsn postgres://... %s", cfg.path("")))
	}
	return sum, nil
}

// allAnomalies reads every anomaly in the store, in entry order.
func (p *Pipeline) allAnomalies(ctx context.Context) ([]provenance.Exec, error) {
	var out []provenance.Exec
	q := provenance.Query{Kind: provenance.KindAnomalies, Sort: provenance.SortEntry, Limit: provenance.NoLimit}
	if err := p.store.Each(ctx, q, func(e provenance.Exec) error {
		out = append(out, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read anomalies: %w", err)
	}
	return out, nil
}

// writeProfiles writes the run's summary: the trial tauexport.ReadTrial builds
// from the store's thread profiles and metadata, as TAU profiles (and into
// TAUdb when a DSN is set).
func (p *Pipeline) writeProfiles(ctx context.Context) (int, error) {
	trial, err := tauexport.ReadTrial(ctx, p.store, p.cfg.RunID)
	if err != nil {
		return 0, fmt.Errorf("build the run's profile: %w", err)
	}
	dir := p.cfg.path("profiles")
	if err := os.RemoveAll(dir); err != nil {
		return 0, fmt.Errorf("write TAU profiles: %w", err)
	}
	return tauexport.Write(ctx, trial, tauexport.Options{Dir: dir, DSN: p.cfg.TaudbDSN})
}

// WriteText prints the summary for a person.
func (s *Summary) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "run\t%s (%d ranks, %s)\n", s.RunID, s.Ranks, strings.ToUpper(s.Algorithm))
	if s.Interrupted != "" {
		fmt.Fprintf(tw, "interrupted\tby %s: the run ended early; this covers what it saw until then, all of it stored\n", s.Interrupted)
	}
	fmt.Fprintf(tw, "input\t%d frames, %d events, %d executions\n", s.Frames, s.Events, s.Executions)
	if s.SummarisedCalls+s.SourceDroppedCalls > 0 {
		fmt.Fprintf(tw, "  \t%d more calls summarised by the event library (in the profiles), %d dropped whole (full buffers)\n", s.SummarisedCalls, s.SourceDroppedCalls)
	}
	if ti := s.TraceInput; ti != nil {
		fmt.Fprintf(tw, "  \t%s input: %d %s read, %d executions\n", ti.Format, ti.InputEvents, inputUnit(ti.Format), ti.Executions)
		for _, line := range ti.Losses.Lines() {
			fmt.Fprintf(tw, "  \tnot in the frames: %s\n", line)
		}
	}
	if s.Live != nil {
		// A live stream goes at the program's pace, not the detectors'.
		fmt.Fprintf(tw, "stream\t%.0f events/s from the program over %.1fs (wall %.1fs)\n", s.EventsPerSecond, s.DetectSeconds, s.WallSeconds)
	} else {
		fmt.Fprintf(tw, "speed\t%.2fM events/s (detection %.1fs, wall %.1fs)\n", s.EventsPerSecond/1e6, s.DetectSeconds, s.WallSeconds)
	}
	if s.AnomaliesFinal != nil {
		fmt.Fprintf(tw, "anomalies\t%d stand after the end-of-run relabelling, of %d flagged live (kipimo query counts the former; --labels all the latter)\n",
			*s.AnomaliesFinal, s.Anomalies)
		fmt.Fprintf(tw, "stored\t%d anomalies, %d normal executions, %d metadata\n",
			s.Stored[provenance.KindAnomalies], s.Stored[provenance.KindNormalExecs], s.Stored[provenance.KindMetadata])
	} else {
		fmt.Fprintf(tw, "anomalies\t%d flagged; stored %d anomalies, %d normal executions, %d metadata\n",
			s.Anomalies, s.Stored[provenance.KindAnomalies], s.Stored[provenance.KindNormalExecs], s.Stored[provenance.KindMetadata])
	}
	if l := s.Live; l != nil {
		fmt.Fprintf(tw, "command\t%s (exit status %d)\n", commandLine(l.Command), l.ExitCode)
		fmt.Fprintf(tw, "event library\t%d processes: %d frames cut, %d sent, %d dropped (%d too large); %d events dropped (full buffers)\n",
			l.Processes, l.Frames, l.FramesSent, l.FramesDropped, l.OversizeFrames, l.EventsDropped)
		if l.DetectorSeenDropped > 0 {
			fmt.Fprintf(tw, "  \t%d of the dropped frames reported in the stream to the detectors (kipimo_ad_source_dropped_frames_total)\n", l.DetectorSeenDropped)
		}
		if l.RanksNotEnded > 0 {
			fmt.Fprintf(tw, "  \t%d ranks never ended their streams (killed?)\n", l.RanksNotEnded)
		}
		for _, e := range l.Errors {
			fmt.Fprintf(tw, "  \t%s\n", e)
		}
	}
	if sc := s.Score; sc != nil {
		fmt.Fprintf(tw, "vs. ground truth\t%s, %s (%d of %d injected found, %d flagged)\n",
			precisionText(sc.Precision, sc.Flagged), recallText(sc.Recall, sc.Injected), sc.TruePositives, sc.Injected, sc.Flagged)
		if l := sc.Live; l != nil {
			fmt.Fprintf(tw, "  live labels\t%s, %s (%d flagged during the run; %d unflagged by the final model)\n",
				precisionText(l.Precision, l.Flagged), recallText(l.Recall, sc.Injected), l.Flagged, l.Unflagged)
			// Phases are scored where the run's steps are known (not for
			// a live program's injected delays): nothing to say otherwise.
			if l.Cold.Flagged+l.Warm.Flagged > 0 {
				fmt.Fprintf(tw, "  live precision\t%s in io_steps 0-%d, %s after\n",
					phaseText(l.Cold), ColdSteps-1, phaseText(l.Warm))
			}
		}
		if s.Live != nil {
			fmt.Fprintf(tw, "  \t%d flags propagated to other ranks' executions of the injected functions; %d anomalies in other functions\n",
				sc.Propagated, sc.FlaggedOtherFunctions)
		}
		for _, k := range sc.Kinds {
			fmt.Fprintf(tw, "  %s\t%d/%d found (recall %.3f)\n", k.Kind, k.Found, k.Injected, k.Recall)
		}
	}
	if len(s.TopFunctions) > 0 {
		var parts []string
		for _, g := range s.TopFunctions {
			parts = append(parts, fmt.Sprintf("%s (%d, %s lost)", g.Func, g.Count, time.Duration(g.TimeLostUs*float64(time.Microsecond)).Round(time.Microsecond)))
		}
		fmt.Fprintf(tw, "top functions\t%s\n", strings.Join(parts, ", "))
	}
	for i, r := range s.Recurring {
		label := ""
		if i == 0 {
			label = "recurring"
		}
		fmt.Fprintf(tw, "%s\t%s: %.2g%% of its calls take about %s (%.0f%% of its time), from io_step %d on %d ranks\n",
			label, r.Func, 100*r.CallsFraction, time.Duration(r.TypicalUs*float64(time.Microsecond)).Round(time.Microsecond), 100*r.TimeShare, r.FirstIOStep, len(r.Ranks))
	}
	writeCulpritText(tw, s)
	writeBaselineText(tw, s)
	if ti := s.TraceInput; ti != nil {
		// A trace is already on disk: what matters is how little of it
		// must be kept and what keeping it costs, not a ratio of two
		// encodings (a small trace's store is mostly fixed overhead).
		fmt.Fprintf(tw, "kept\t%d of %d executions (%s): %d anomalies, %d normal executions\n",
			s.KeptExecutions, ti.Executions, percent(s.KeptFraction), s.Stored[provenance.KindAnomalies], s.Stored[provenance.KindNormalExecs])
		perAnomaly := "no anomaly"
		if s.Anomalies > 0 {
			perAnomaly = bytesText(int64(s.BytesPerAnomaly)) + " per anomaly"
		}
		fmt.Fprintf(tw, "data\t%s stored: %s, %s per input event (%d events, %s of frames)\n",
			bytesText(s.StoredBytes), perAnomaly, bytesFrac(s.BytesPerInputEvent), s.Events, bytesText(s.RawBytes))
	} else if s.Reduction >= 1 || s.StoredBytes == 0 {
		fmt.Fprintf(tw, "data\t%s of frames -> %s stored (reduction %.1fx; %.0fx against TAU's %d B/event stream)\n", bytesText(s.RawBytes), bytesText(s.StoredBytes), s.Reduction, s.ReductionVsTAU, tauStreamBytesPerEvent)
	} else {
		// A short run: the store's fixed size outweighs the frames.
		fmt.Fprintf(tw, "data\t%s of frames -> %s stored (a short run: the store's fixed size outweighs its frames; %s per input event)\n",
			bytesText(s.RawBytes), bytesText(s.StoredBytes), bytesFrac(s.BytesPerInputEvent))
	}
	if s.NATSBytes > 0 {
		fmt.Fprintf(tw, "  \tNATS data kept (--keep-nats): %s more in %s\n", bytesText(s.NATSBytes), filepath.Join(filepath.Dir(s.Store), "nats"))
	}
	if b := s.Backpressure; b != nil && b.HeldFrames > 0 {
		fmt.Fprintf(tw, "back-pressure\tinput waited %.1fs for detectors (%d frames held); at most %d steps behind (bound %d); waited longest for rank %d (%.1fs)\n",
			b.HeldSeconds, b.HeldFrames, b.MaxBehind, b.Bound, b.SlowestRank, b.SlowestRankHeldSeconds)
	}
	if s.BadFrames+s.MissingSteps+s.UnmatchedExits+s.DroppedRecords+s.SyncFailures+uint64(s.BadProvenance) > 0 {
		fmt.Fprintf(tw, "faults\t%d bad frames, %d io_steps missing (frames that never reached a detector), %d unmatched exits, %d dropped records, %d failed syncs, %d bad provenance messages\n",
			s.BadFrames, s.MissingSteps, s.UnmatchedExits, s.DroppedRecords, s.SyncFailures, s.BadProvenance)
	}
	fmt.Fprintf(tw, "provenance\t%s\n", s.Store)
	if s.ProfilesDir != "" {
		fmt.Fprintf(tw, "TAU profiles\t%s\n", s.ProfilesDir)
	} else {
		fmt.Fprintf(tw, "TAU profiles\tnone: no rank streamed an io_step\n")
	}
	if s.TaudbTrial != 0 {
		fmt.Fprintf(tw, "TAUdb trial\t%d\n", s.TaudbTrial)
	}
	if s.Truth != "" {
		fmt.Fprintf(tw, "ground truth\t%s\n", s.Truth)
	}
	fmt.Fprintf(tw, "dashboard\t%s\n", dashboardText(s.Dashboard, s.DashboardServed))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nexplore:")
	for _, c := range s.Explore {
		fmt.Fprintln(w, "  "+c)
	}
	return nil
}

// precisionText is a precision for the summary, or that there is none to
// measure when nothing was flagged.
func precisionText(p float64, flagged int) string {
	if flagged == 0 {
		return "precision not measured (nothing flagged)"
	}
	return fmt.Sprintf("precision %.3f", p)
}

// recallText is a recall for the summary, or that there is none to
// measure when nothing was injected (a program whose injected function was
// never called).
func recallText(r float64, injected int) string {
	if injected == 0 {
		return "recall not measured (nothing injected)"
	}
	return fmt.Sprintf("recall %.3f", r)
}

// phaseText is one phase's live precision for the summary.
func phaseText(ph PhaseScore) string {
	if ph.Flagged == 0 {
		return "none flagged"
	}
	return fmt.Sprintf("%.3f (%d flagged)", ph.Precision, ph.Flagged)
}

// How long a run's dashboard is served (Summary.DashboardServed).
const (
	// DashboardDuringRun: the dashboard was served while the run lasted
	// and stops with it.
	DashboardDuringRun = "during_run"
	// DashboardUntilInterrupted: the dashboard stays up after the run until
	// the process is interrupted (kipimo run --keep-serving).
	DashboardUntilInterrupted = "until_interrupted"
)

// dashboardText is the summary's dashboard line: a URL that still answers
// only when it is kept up; otherwise it says the dashboard is gone and how
// to keep it.
func dashboardText(url, served string) string {
	if served == DashboardUntilInterrupted {
		return url + " (still served until interrupted: Ctrl-C stops it)"
	}
	return fmt.Sprintf("served at %s during the run only, now stopped (run with --keep-serving to keep it up after the run)", url)
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// WriteJSON prints the summary as one JSON object.
func (s *Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	return enc.Encode(s)
}

// inputUnit names what a reader of format counts as the input's events.
func inputUnit(format string) string {
	switch format {
	case replay.FormatTAU:
		return "records"
	case replay.FormatCaliper:
		return "snapshot records"
	case replay.FormatChrome:
		return "trace events"
	}
	return "events"
}

// percent writes a fraction as a percentage with the digits it needs.
func percent(f float64) string {
	switch p := 100 * f; {
	case p == 0:
		return "0%"
	case p < 0.1:
		return fmt.Sprintf("%.3f%%", p)
	case p < 10:
		return fmt.Sprintf("%.2f%%", p)
	default:
		return fmt.Sprintf("%.1f%%", p)
	}
}

// bytesFrac writes a byte count that may be below one byte per item.
func bytesFrac(n float64) string {
	if n >= 1<<10 {
		return bytesText(int64(n))
	}
	return fmt.Sprintf("%.1f B", n)
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
