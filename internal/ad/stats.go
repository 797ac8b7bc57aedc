package ad

import "sync/atomic"

// counters are a detector's counts, written by its goroutine and read by
// anyone.
type counters struct {
	frames, badFrames, events, executions, anomalies atomic.Uint64
	unmatchedExits, mismatchedExits, repairedOpen    atomic.Uint64
	openAtEnd, unscored, records, droppedRecords     atomic.Uint64
	syncs, syncFailures, droppedSummaries            atomic.Uint64
	modelErrors, evictedLaunches                     atomic.Uint64
	unmatchedCorrelations                            atomic.Uint64
	// sourceDropped is the latest count the rank's event source reported
	// of frames it dropped before they reached NATS (SourceDroppedHeader).
	sourceDropped atomic.Uint64
	// missingSteps are io_steps skipped in the rank's sequence of frames
	missingSteps atomic.Uint64
	// pathOverflows are executions whose call path found no room in the
	// call-path table (Config.ProfilePaths).
	pathOverflows atomic.Uint64
	// unnamedFrames are frames dropped while waiting for the names of
	// ids their events use (Config.MaxHeldFrames, or held at Close).
	unnamedFrames atomic.Uint64
	// lostAtGap are executions open when a gap in the rank's io_steps was
	// found, closed as lost (never modelled); staleFrames are frames whose
	// io_step was not after the last one processed, dropped.
	lostAtGap, staleFrames atomic.Uint64
	// droppedFrames are frames dropped before the detector read them: its
	// input queue was full (adnode.ServeConfig.PendingFrames, PendingBytes).
	droppedFrames atomic.Uint64
	// what the rank's event library reported it summarised or dropped
	// (sourcecounters.go)
	summarisedCalls, sourceDroppedCalls, sourceDroppedEvents atomic.Uint64
	// how much of those three the step summaries sent so far carried: each
	// summary carries what was reported since (step.go)
	summarisedSynced, sourceDroppedCallsSynced, sourceDroppedEventsSynced atomic.Uint64
	// ended is set once the rank's stream ended (end-of-stream message).
	ended atomic.Bool
}

// taken is how many frames the detector has taken from its input:
// processed, rejected, dropped as stale or dropped unread.
func (c *counters) taken() uint64 {
	return c.frames.Load() + c.badFrames.Load() + c.staleFrames.Load() + c.droppedFrames.Load()
}

// Stats is a snapshot of a detector's counts.
type Stats struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
	// Frames processed and frames rejected.
	Frames    uint64 `json:"frames"`
	BadFrames uint64 `json:"bad_frames"`
	// Events of all kinds (function, counter, comm) in processed frames.
	Events uint64 `json:"events"`
	// Executions completed, and those labelled anomalous.
	Executions uint64 `json:"executions"`
	Anomalies  uint64 `json:"anomalies"`
	// UnmatchedExits are exits with no open entry of their function (dropped,
	// counted); MismatchedExits are exits that closed an entry deeper in the
	// stack, RepairedOpen the entries above it they closed; OpenAtEnd are
	// entries still open at Close, closed there.
	UnmatchedExits  uint64 `json:"unmatched_exits"`
	MismatchedExits uint64 `json:"mismatched_exits"`
	RepairedOpen    uint64 `json:"repaired_open"`
	OpenAtEnd       uint64 `json:"open_at_end"`
	// Unscored executions were labelled normal because their model had fewer
	// than MinCount values.
	Unscored uint64 `json:"unscored"`
	// Records handed to the sink, and records it did not accept.
	Records        uint64 `json:"records"`
	DroppedRecords uint64 `json:"dropped_records"`
	// Syncs answered, sync attempts failed, step summaries dropped while the
	// pserver was unreachable.
	Syncs            uint64 `json:"syncs"`
	SyncFailures     uint64 `json:"sync_failures"`
	DroppedSummaries uint64 `json:"dropped_summaries"`
	// Lag is the number of steps whose deltas the pserver has not answered yet
	// (0 when in sync).
	Lag uint64 `json:"lag_steps"`
	// ModelErrors are histogram merges refused as malformed;
	// EvictedLaunches are CPU launches forgotten before their GPU kernel
	// came; UnmatchedCorrelations are GPU records without a known launch.
	ModelErrors           uint64 `json:"model_errors"`
	EvictedLaunches       uint64 `json:"evicted_launches"`
	UnmatchedCorrelations uint64 `json:"unmatched_correlations"`
	// SourceDroppedFrames are frames the rank's event source (the in-process
	// event library) dropped before they reached NATS: its queue was full
	// or the server was gone.
	SourceDroppedFrames uint64 `json:"source_dropped_frames"`
	// MissingSteps are io_steps that never reached the detector: gaps in the
	// rank's sequence of frames (lost on the way, or dropped by a source
	// that does not say so).
	MissingSteps uint64 `json:"missing_steps"`
	// PathOverflows are executions whose call path found no room in the
	// call-path table (Config.ProfilePaths): they count in their function's
	// flat profile only.
	PathOverflows uint64 `json:"path_overflows"`
	// UnnamedFrames are frames dropped because their events used function
	// or counter ids whose names had not arrived: more than MaxHeldFrames
	// frames waited, or the stream ended first. Their steps are also
	// missing steps downstream.
	UnnamedFrames uint64 `json:"unnamed_frames"`
	// LostAtGap are executions that were open when a gap in the rank's
	// io_steps was found: their exits were lost in the gap, so they were
	// closed without a runtime and kept out of every model, label, profile
	// and record (an entry before a gap is never paired with an exit after
	// it).
	LostAtGap uint64 `json:"lost_at_gap"`
	// StaleFrames are frames dropped because their io_step was not after the
	// last one processed (duplicates, or frames overtaken by later ones).
	StaleFrames uint64 `json:"stale_frames"`
	// DroppedFrames are frames dropped before the detector read them
	// because it was slower than its input (its queue was full in frames or
	// bytes); their steps are also missing steps.
	DroppedFrames uint64 `json:"dropped_frames"`
	// SummarisedCalls are calls the rank's event library summarised per
	// io_step instead of streaming them (functions called faster than its
	// rate): in the profiles, never scored. SourceDroppedCalls are calls
	// it dropped whole, and SourceDroppedEvents comm and counter events it
	// dropped, because its buffers were full.
	SummarisedCalls     uint64 `json:"summarised_calls"`
	SourceDroppedCalls  uint64 `json:"source_dropped_calls"`
	SourceDroppedEvents uint64 `json:"source_dropped_events"`
	// Ended tells whether the rank's stream ended with an end-of-stream
	// message (Add leaves it alone).
	Ended bool `json:"ended"`
}

// Stats returns the detector's counts; safe for concurrent use.
func (d *Detector) Stats() Stats {
	c := &d.stats
	return Stats{
		PID: d.cfg.PID, Rank: d.cfg.Rank,
		Frames: c.frames.Load(), BadFrames: c.badFrames.Load(), Events: c.events.Load(),
		Executions: c.executions.Load(), Anomalies: c.anomalies.Load(),
		UnmatchedExits: c.unmatchedExits.Load(), MismatchedExits: c.mismatchedExits.Load(),
		RepairedOpen: c.repairedOpen.Load(), OpenAtEnd: c.openAtEnd.Load(), Unscored: c.unscored.Load(),
		Records: c.records.Load(), DroppedRecords: c.droppedRecords.Load(),
		Syncs: c.syncs.Load(), SyncFailures: c.syncFailures.Load(), DroppedSummaries: c.droppedSummaries.Load(),
		Lag:         d.sync.lag.Load(),
		ModelErrors: c.modelErrors.Load(), EvictedLaunches: c.evictedLaunches.Load(),
		UnmatchedCorrelations: c.unmatchedCorrelations.Load(),
		SourceDroppedFrames:   c.sourceDropped.Load(),
		MissingSteps:          c.missingSteps.Load(),
		Ended:                 c.ended.Load(),
		PathOverflows:         c.pathOverflows.Load(),
		UnnamedFrames:         c.unnamedFrames.Load(),
		LostAtGap:             c.lostAtGap.Load(),
		StaleFrames:           c.staleFrames.Load(),
		DroppedFrames:         c.droppedFrames.Load(),
		SummarisedCalls:       c.summarisedCalls.Load(),
		SourceDroppedCalls:    c.sourceDroppedCalls.Load(),
		SourceDroppedEvents:   c.sourceDroppedEvents.Load(),
	}
}

// Add sums o into s (for node totals).
func (s *Stats) Add(o Stats) {
	s.Frames += o.Frames
	s.BadFrames += o.BadFrames
	s.Events += o.Events
	s.Executions += o.Executions
	s.Anomalies += o.Anomalies
	s.UnmatchedExits += o.UnmatchedExits
	s.MismatchedExits += o.MismatchedExits
	s.RepairedOpen += o.RepairedOpen
	s.OpenAtEnd += o.OpenAtEnd
	s.Unscored += o.Unscored
	s.Records += o.Records
	s.DroppedRecords += o.DroppedRecords
	s.Syncs += o.Syncs
	s.SyncFailures += o.SyncFailures
	s.DroppedSummaries += o.DroppedSummaries
	s.Lag = max(s.Lag, o.Lag)
	s.ModelErrors += o.ModelErrors
	s.EvictedLaunches += o.EvictedLaunches
	s.UnmatchedCorrelations += o.UnmatchedCorrelations
	s.SourceDroppedFrames += o.SourceDroppedFrames
	s.MissingSteps += o.MissingSteps
	s.PathOverflows += o.PathOverflows
	s.UnnamedFrames += o.UnnamedFrames
	s.LostAtGap += o.LostAtGap
	s.StaleFrames += o.StaleFrames
	s.DroppedFrames += o.DroppedFrames
	s.SummarisedCalls += o.SummarisedCalls
	s.SourceDroppedCalls += o.SourceDroppedCalls
	s.SourceDroppedEvents += o.SourceDroppedEvents
}

// mergeErrors counts the parts of a model that failed to merge (err joins
// one error per part, stats.Summary.Merge), as model errors.
func (c *counters) mergeErrors(err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		c.modelErrors.Add(uint64(len(j.Unwrap())))
		return
	}
	c.modelErrors.Add(1)
}
