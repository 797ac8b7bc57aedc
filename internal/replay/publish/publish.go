// Package publish sends a replay.Source to NATS: each frame, binary encoded,
// on natsx.Subjects.Frames(pid, rank), each rank's frames in step order,
// paced to the recorded step times or as fast as the connection takes them.
// It is the library behind `kipimo replay` and the whole-pipeline command.
//
// Every Pace.NamesEvery frames of a rank, and in each rank's next frame
// after the connection reconnected, the frame carries every function,
// counter and metadata entry of the rank published so far, so that a
// detector that starts late learns every name within that many frames.
package publish

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
)

// DefaultNamesEvery is Pace.NamesEvery's default, the same as the event
// library's KIPIMO_NAMES_EVERY: a detector that starts late waits at most 15
// frames of a rank for its names (it holds them meanwhile; 64 by default,
// ad.DefaultMaxHeldFrames), and the dictionary costs one frame in 16 its
// size (docs/wire-formats.md gives the bytes measured).
const DefaultNamesEvery = 16

// Pace says how fast to publish.
type Pace struct {
	// Speed scales recorded time: 1 is real time, 10 ten times faster. 0 (or
	// +Inf) publishes as fast as possible.
	Speed float64
	// FlushEvery makes the publisher wait for the server to acknowledge
	// everything sent (a round trip) every N frames, so a fast source cannot
	// run ahead of a slow server. Default 64.
	FlushEvery int
	// FlushTimeout bounds each of those waits. Default 30 s.
	FlushTimeout time.Duration
	// NamesEvery makes every NamesEvery-th frame of a rank carry the rank's
	// whole dictionary: every function, counter and metadata entry its
	// frames carried so far (a frame's names are otherwise only in the
	// frame that uses them first). 0 means DefaultNamesEvery; negative
	// never (only after a reconnect).
	NamesEvery int
	// EndOfStream, when set, ends each rank's stream after its last frame
	// with an empty message on its subject (detectors close the rank's
	// stream on it).
	EndOfStream bool
	// Progress, when set, is called with the running counts at most every
	// ProgressEvery (default 250 ms) and once at the end; it runs on the
	// publishing goroutine and must return quickly.
	Progress      func(Counts)
	ProgressEvery time.Duration
}

// ParseSpeed reads "max", "realtime" or "<N>x" (e.g. 10x, 0.5x).
func ParseSpeed(s string) (float64, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "max", "":
		return 0, nil
	case "realtime", "1x":
		return 1, nil
	}
	n, ok := strings.CutSuffix(strings.ToLower(strings.TrimSpace(s)), "x")
	if !ok {
		return 0, fmt.Errorf("speed %q: want max, realtime or a factor such as 10x", s)
	}
	v, err := strconv.ParseFloat(n, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("speed %q: the factor must be a positive number, as in 10x or 0.5x", s)
	}
	return v, nil
}

// Counts is what Frames has published so far.
type Counts struct {
	Frames  int
	Events  int
	Bytes   int64
	Elapsed time.Duration
	// Done and Total are the input bytes read and the input size when the
	// source knows them (replay.Sizer), else 0.
	Done, Total int64
}

// Rate is events per second so far.
func (c Counts) Rate() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(c.Events) / c.Elapsed.Seconds()
}

// ETA estimates the time left from the input read so far, or -1 when unknown.
func (c Counts) ETA() time.Duration {
	if c.Total <= 0 || c.Done <= 0 || c.Done > c.Total {
		return -1
	}
	return time.Duration(float64(c.Elapsed) * float64(c.Total-c.Done) / float64(c.Done))
}

// Frames publishes every frame of src and returns what it sent and the
// source's stats. It stops at the first error (including ctx's).
func Frames(ctx context.Context, nc *nats.Conn, subjects natsx.Subjects, src replay.Source, pace Pace) (Counts, replay.Stats, error) {
	if err := natsx.ValidRun(subjects.Run); err != nil {
		return Counts{}, replay.Stats{}, err
	}
	if pace.FlushEvery <= 0 {
		pace.FlushEvery = 64
	}
	if pace.FlushTimeout <= 0 {
		pace.FlushTimeout = 30 * time.Second
	}
	if pace.ProgressEvery <= 0 {
		pace.ProgressEvery = 250 * time.Millisecond
	}
	if pace.NamesEvery == 0 {
		pace.NamesEvery = DefaultNamesEvery
	}
	paced := pace.Speed > 0 && !math.IsInf(pace.Speed, 1)
	sizer, _ := src.(replay.Sizer)
	var c Counts
	start := time.Now()
	lastReport := start
	var t0 uint64
	haveT0 := false
	var buf []byte
	maxPayload := nc.MaxPayload()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	report := func(force bool) {
		if pace.Progress == nil {
			return
		}
		now := time.Now()
		if !force && now.Sub(lastReport) < pace.ProgressEvery {
			return
		}
		lastReport = now
		c.Elapsed = now.Sub(start)
		if sizer != nil {
			c.Done, c.Total = sizer.Progress()
		}
		pace.Progress(c)
	}
	type pr struct{ pid, rank uint32 }
	var ranks []pr
	dicts := map[pr]*dictionary{}
	reconnects := nc.Stats().Reconnects
	st, err := src.Frames(ctx, func(f *frame.Frame) error {
		k := pr{f.PID, f.Rank}
		dict := dicts[k]
		if dict == nil {
			dict = newDictionary()
			dicts[k] = dict
			ranks = append(ranks, k)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// After a reconnect the server may have subscribers that missed
		// the names: every rank's next frame carries them all.
		if n := nc.Stats().Reconnects; n != reconnects {
			reconnects = n
			for _, d := range dicts {
				d.resend = true
			}
		}
		if paced {
			// A step is sent once its recorded end has passed, counting
			// from the end of the first step (sent at once).
			end := max(f.TEnd, f.TStart)
			if !haveT0 {
				t0, haveT0 = end, true
			}
			if end > t0 {
				due := start.Add(time.Duration(float64(end-t0) * float64(time.Microsecond) / pace.Speed))
				if wait := time.Until(due); wait > 0 {
					timer.Reset(wait)
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-timer.C:
					}
				}
			}
		}
		buf = dict.encode(buf[:0], f, pace.NamesEvery, maxPayload)
		if int64(len(buf)) > maxPayload {
			return fmt.Errorf("frame of rank %d step %d is %d bytes, more than the server's max payload of %d bytes (raise it, or cut shorter steps with --step)", f.Rank, f.Step, len(buf), maxPayload)
		}
		if err := nc.Publish(subjects.Frames(f.PID, f.Rank), buf); err != nil {
			return fmt.Errorf("publish frame of rank %d step %d: %w", f.Rank, f.Step, err)
		}
		c.Frames++
		c.Events += f.NumEvents()
		c.Bytes += int64(len(buf))
		if c.Frames%pace.FlushEvery == 0 {
			if err := flush(ctx, nc, pace.FlushTimeout); err != nil {
				return err
			}
		}
		report(false)
		return nil
	})
	if err == nil && pace.EndOfStream {
		for _, k := range ranks {
			if err = nc.Publish(subjects.Frames(k.pid, k.rank), nil); err != nil {
				err = fmt.Errorf("publish the end of rank %d's stream: %w", k.rank, err)
				break
			}
		}
	}
	if err == nil {
		err = flush(ctx, nc, pace.FlushTimeout)
	}
	report(true)
	c.Elapsed = time.Since(start)
	return c, st, err
}

func flush(ctx context.Context, nc *nats.Conn, timeout time.Duration) error {
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("NATS server did not acknowledge published frames within %s: %w", timeout, err)
		}
		return fmt.Errorf("flush frames to NATS: %w", err)
	}
	return nil
}

// dictionary is every name one rank's frames carried so far, in the order
// they first came, with the last name or value given to each id or key.
type dictionary struct {
	funcs, counters []frame.Name
	fidx, cidx      map[uint32]int
	meta            []frame.Meta
	midx            map[metaKey]int
	frames          int  // frames of the rank published
	resend          bool // the next frame carries the whole dictionary
	full            frame.Frame
}

type metaKey struct {
	tid uint32
	key string
}

func newDictionary() *dictionary {
	return &dictionary{fidx: map[uint32]int{}, cidx: map[uint32]int{}, midx: map[metaKey]int{}}
}

// learn adds f's dictionary entries.
func (d *dictionary) learn(f *frame.Frame) {
	for _, n := range f.Funcs {
		if i, ok := d.fidx[n.ID]; ok {
			d.funcs[i].Name = n.Name
			continue
		}
		d.fidx[n.ID] = len(d.funcs)
		d.funcs = append(d.funcs, n)
	}
	for _, n := range f.Counters {
		if i, ok := d.cidx[n.ID]; ok {
			d.counters[i].Name = n.Name
			continue
		}
		d.cidx[n.ID] = len(d.counters)
		d.counters = append(d.counters, n)
	}
	for _, m := range f.Metadata {
		k := metaKey{m.Tid, m.Key}
		if i, ok := d.midx[k]; ok {
			d.meta[i].Value = m.Value
			continue
		}
		d.midx[k] = len(d.meta)
		d.meta = append(d.meta, m)
	}
}

// encode appends f's binary form to b, with the whole dictionary in place
// of f's own entries when it is due: every every-th frame (every > 0) and
// after a reconnect. When the dictionary would make the frame larger than
// maxPayload, f goes as it is and the dictionary goes with the next frame.
// f is not modified.
func (d *dictionary) encode(b []byte, f *frame.Frame, every int, maxPayload int64) []byte {
	d.learn(f)
	n := d.frames
	d.frames++
	if n == 0 || !(d.resend || (every > 0 && n%every == 0)) {
		return frame.AppendBinary(b, f)
	}
	d.full = *f
	d.full.Funcs, d.full.Counters, d.full.Metadata = d.funcs, d.counters, d.meta
	out := frame.AppendBinary(b, &d.full)
	d.full = frame.Frame{}
	if int64(len(out)) > maxPayload {
		d.resend = true
		return frame.AppendBinary(out[:len(b)], f)
	}
	d.resend = false
	return out
}
