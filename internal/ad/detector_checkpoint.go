package ad

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
)

// The detector's own part of a checkpoint: the current step's fields, the
// last step seen, the per-step counts, the metadata keys seen, the counts
// behind Stats (in counterFields' order) and the sync lag.

// detector writes the detector's step fields, metadata keys seen, counts
// and sync lag.
func (w *ckWriter) detector(d *Detector) {
	w.Uvarint(d.cur.step)
	w.Uvarint(d.cur.tstart)
	w.Uvarint(d.cur.tend)
	w.Uvarint(d.lastStep)
	w.Bool(d.lastSeen)
	w.Uvarint(d.missing)
	w.Uvarint(d.stepEvents)
	w.Uvarint(d.stepBad)
	w.Uvarint(d.processed)
	w.Bool(d.requestProfiles.Load())
	w.Bool(d.heldOnce)
	keys := slices.SortedFunc(maps.Keys(d.metaSeen), func(a, b metaKey) int {
		if a.tid != b.tid {
			return int(a.tid) - int(b.tid)
		}
		return strings.Compare(a.key, b.key)
	})
	w.Uvarint(uint64(len(keys)))
	for _, k := range keys {
		w.U32(k.tid)
		w.Str(k.key)
	}
	c := &d.stats
	cs := counterFields(c)
	w.Uvarint(uint64(len(cs)))
	for _, p := range cs {
		w.Uvarint(p.Load())
	}
	w.Bool(c.ended.Load())
	w.Uvarint(d.sync.lag.Load())
}

// counterFields lists the detector's counts in their checkpoint order (new
// counts go at the end).
func counterFields(c *counters) []*atomic.Uint64 {
	return []*atomic.Uint64{
		&c.frames, &c.badFrames, &c.events, &c.executions, &c.anomalies,
		&c.unmatchedExits, &c.mismatchedExits, &c.repairedOpen,
		&c.openAtEnd, &c.unscored, &c.records, &c.droppedRecords,
		&c.syncs, &c.syncFailures, &c.droppedSummaries,
		&c.modelErrors, &c.evictedLaunches, &c.unmatchedCorrelations,
		&c.sourceDropped, &c.missingSteps, &c.pathOverflows,
		&c.unnamedFrames, &c.lostAtGap, &c.staleFrames, &c.droppedFrames,
		&c.summarisedCalls, &c.sourceDroppedCalls, &c.sourceDroppedEvents,
		&c.summarisedSynced, &c.sourceDroppedCallsSynced, &c.sourceDroppedEventsSynced,
	}
}

// detector reads what ckWriter.detector wrote.
func (r *ckReader) detector(d *Detector) {
	d.cur.step = r.Uvarint()
	d.cur.tstart = r.Uvarint()
	d.cur.tend = r.Uvarint()
	d.lastStep = r.Uvarint()
	d.lastSeen = r.Bool()
	d.missing = r.Uvarint()
	d.stepEvents = r.Uvarint()
	d.stepBad = r.Uvarint()
	d.processed = r.Uvarint()
	d.requestProfiles.Store(r.Bool())
	d.heldOnce = r.Bool()
	n := r.Count(2)
	for range n {
		tid := r.U32()
		d.metaSeen[metaKey{tid, r.Str()}] = struct{}{}
	}
	cs := counterFields(&d.stats)
	// A checkpoint of an earlier version has fewer counts: the newer ones
	// start at zero.
	n = r.Count(1)
	if r.Err == nil && n > len(cs) {
		r.Fail("%d counts, this detector keeps %d", n, len(cs))
	}
	for i, p := range cs {
		if i < n {
			p.Store(r.Uvarint())
		}
	}
	if n < len(cs) {
		// a checkpoint from before step summaries carried the event
		// library's counts: what it reported so far is not sent again
		c := &d.stats
		c.summarisedSynced.Store(c.summarisedCalls.Load())
		c.sourceDroppedCallsSynced.Store(c.sourceDroppedCalls.Load())
		c.sourceDroppedEventsSynced.Store(c.sourceDroppedEvents.Load())
	}
	d.stats.ended.Store(r.Bool())
	d.sync.lag.Store(r.Uvarint())
}
