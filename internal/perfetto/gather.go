package perfetto

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Source is where records are read: a provenance.Store, or a client of
// provdb's HTTP API.
type Source interface {
	// Each streams the executions q selects (provenance.Store.Each).
	Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error
	// Get returns one record, or an error wrapping provenance.ErrNotFound.
	Get(ctx context.Context, kind provenance.Kind, pid uint32, eventID string) (provenance.Exec, error)
}

// Choice is what a timeline holds.
type Choice struct {
	// Record, when set, is the event id of the record (of program PID)
	// whose window is exported: it, and the records of its io_step and
	// the ones beside it (or of StepMin..StepMax) whose windows or
	// callers overlap its window's time span widened by Margin µs on each
	// side (what each rank was running then), cut to that span.
	Record string
	PID    uint32
	Margin uint64
	// StepMin and StepMax, when set, bound the records' io_steps.
	StepMin, StepMax *uint64
	// Ranks, when not nil, are the only ranks read.
	Ranks []uint32
	// MaxRecords bounds the records read (ErrTooMany beyond); 0: no bound.
	MaxRecords int
}

// Errors of Gather.
var (
	// ErrTooMany is returned when more than Choice.MaxRecords records
	// match.
	ErrTooMany = errors.New("too many records")
	// ErrNoRecords is returned when no record matches.
	ErrNoRecords = errors.New("no records match")
)

// Gather reads the records c chooses from src into a new timeline and
// returns it.
func Gather(ctx context.Context, src Source, c Choice) (*Timeline, error) {
	q := provenance.Query{Limit: provenance.NoLimit, StepMin: c.StepMin, StepMax: c.StepMax}
	var opt Options
	var anchor *provenance.Exec
	var anchorKind provenance.Kind
	if c.Record != "" {
		if _, _, _, err := provenance.ParseEventID(c.Record); err != nil {
			return nil, err
		}
		e, kind, err := getAny(ctx, src, c.PID, c.Record)
		if err != nil {
			return nil, err
		}
		anchor, anchorKind = &e, kind
		lo, hi := windowSpan(&e)
		opt.From, opt.To = lo-min(lo, c.Margin), hi+c.Margin
		if q.StepMin == nil && q.StepMax == nil {
			s0, s1 := e.IOStep-min(e.IOStep, 1), e.IOStep+1
			q.StepMin, q.StepMax = &s0, &s1
		}
	}
	tl := New(opt)
	if anchor != nil {
		tl.Add(anchorKind, anchor)
	}
	n := 0
	add := func(kind provenance.Kind) func(provenance.Exec) error {
		return func(e provenance.Exec) error {
			if anchor != nil {
				if e.PID != anchor.PID {
					return nil
				}
				if !overlaps(&e, opt.From, opt.To) {
					return nil
				}
			}
			if n++; c.MaxRecords > 0 && n > c.MaxRecords {
				return ErrTooMany
			}
			tl.Add(kind, &e)
			return nil
		}
	}
	for _, kind := range []provenance.Kind{provenance.KindAnomalies, provenance.KindNormalExecs} {
		kq := q
		kq.Kind = kind
		var err error
		if c.Ranks == nil {
			err = src.Each(ctx, kq, add(kind))
		} else {
			for _, r := range c.Ranks {
				rq := kq
				rq.Rank = &r
				if err = src.Each(ctx, rq, add(kind)); err != nil {
					break
				}
			}
		}
		if errors.Is(err, ErrTooMany) {
			return nil, fmt.Errorf("more than %d records: %w", c.MaxRecords, ErrTooMany)
		}
		if err != nil {
			return nil, fmt.Errorf("read the %s: %w", kind, err)
		}
	}
	if n == 0 && anchor == nil {
		return nil, ErrNoRecords
	}
	return tl, nil
}

// getAny reads the record of id: an anomaly, else a normal execution.
func getAny(ctx context.Context, src Source, pid uint32, id string) (provenance.Exec, provenance.Kind, error) {
	e, err := src.Get(ctx, provenance.KindAnomalies, pid, id)
	if err == nil {
		return e, provenance.KindAnomalies, nil
	}
	if e, err2 := src.Get(ctx, provenance.KindNormalExecs, pid, id); err2 == nil {
		return e, provenance.KindNormalExecs, nil
	}
	return e, "", fmt.Errorf("record %s of program %d: %w", id, pid, err)
}

// windowSpan is the time span (µs) of a record's execution and its event
// window, not of its callers, which may span the whole run.
func windowSpan(e *provenance.Exec) (lo, hi uint64) {
	lo, hi = e.Entry, max(e.Exit, e.Entry)
	for _, w := range e.EventWindow.ExecWindow {
		lo, hi = min(lo, w.Entry), max(hi, w.Exit, w.Entry)
	}
	return lo, hi
}

// overlaps reports whether an execution of e's call stack or window
// overlaps [from, to] (a caller whose exit was not seen is taken to run
// on).
func overlaps(e *provenance.Exec, from, to uint64) bool {
	in := func(entry, exit uint64) bool { return entry <= to && (exit == 0 || exit >= from) }
	if in(e.Entry, e.Exit) {
		return true
	}
	for _, f := range e.CallStack {
		if in(f.Entry, f.Exit) {
			return true
		}
	}
	for _, w := range e.EventWindow.ExecWindow {
		if in(w.Entry, w.Exit) {
			return true
		}
	}
	return false
}

// ParseSpan reads "A-B" or "A" (A <= B): a range of io_steps or ranks.
func ParseSpan(s string) (lo, hi uint64, err error) {
	a, b, found := strings.Cut(strings.TrimSpace(s), "-")
	if lo, err = strconv.ParseUint(strings.TrimSpace(a), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%q is not a number or a range A-B", s)
	}
	hi = lo
	if found {
		if hi, err = strconv.ParseUint(strings.TrimSpace(b), 10, 64); err != nil {
			return 0, 0, fmt.Errorf("%q is not a number or a range A-B", s)
		}
	}
	if hi < lo {
		return 0, 0, fmt.Errorf("range %q is empty (%d > %d)", s, lo, hi)
	}
	return lo, hi, nil
}

// ParseRanks reads a list of ranks and ranges, "0-3,8", into sorted
// distinct ranks.
func ParseRanks(s string) ([]uint32, error) {
	var out []uint32
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, err := ParseSpan(part)
		if err != nil {
			return nil, fmt.Errorf("ranks: %w", err)
		}
		if hi >= 1<<31 || hi-lo >= 1<<20 {
			return nil, fmt.Errorf("ranks: %q is too wide", part)
		}
		for r := lo; r <= hi; r++ {
			out = append(out, uint32(r))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
