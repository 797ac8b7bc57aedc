// Package replay turns traces made by other tools (TAU .trc/.edf, Caliper .cali
// event traces, Chrome/Perfetto JSON, OTF2 archives) and Kipimo's own frame files into the
// frame stream the detector consumes, and writes them as frame files.
//
// A Source yields frames, each rank's in step order; Open picks the reader for
// a format. Convert writes a Source to DIR/rank-<r>.frames, the layout
// `kipimo gen` writes. Package publish sends a Source to NATS.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/caliper"
	"github.com/kipimo-hpc/kipimo/internal/replay/chrome"
	"github.com/kipimo-hpc/kipimo/internal/replay/kmerge"
	"github.com/kipimo-hpc/kipimo/internal/replay/otf2"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/replay/tautrace"
)

// Formats a Source can read.
const (
	FormatTAU     = "tau"
	FormatCaliper = "caliper"
	FormatChrome  = "chrome"
	FormatOTF2    = "otf2"
	FormatFrames  = "frames"
)

// Formats lists the formats Open accepts.
var Formats = []string{FormatTAU, FormatCaliper, FormatChrome, FormatOTF2, FormatFrames}

// Stats counts what a Source produced; see steps.Stats.
type Stats = steps.Stats

// Losses counts, per kind, what an input held that its reader did not turn
// into frames as it was (unclosed spans, instants, overlaps moved to extra
// threads, skipped files...); see steps.Losses and the steps.Loss* kinds.
type Losses = steps.Losses

// Loss is one kind of loss: its count and first example.
type Loss = steps.Loss

// ErrNothingUsable is wrapped by the error of a trace Source whose input
// held no event the frames carry (no function, counter or message event):
// metadata-only or profile-only inputs.
var ErrNothingUsable = errors.New("the input holds no event frames can carry")

// Source yields frames. Frames calls emit with each frame, every rank's frames
// in step order (ranks may interleave); the frame is owned by the Source and
// reused after emit returns. An error from emit stops the source and is
// returned. A Source may be read once.
type Source interface {
	Frames(ctx context.Context, emit func(*frame.Frame) error) (Stats, error)
}

// Sizer is implemented by Sources that know their input size in bytes and how
// much of it they have read, for progress reports.
type Sizer interface {
	// Progress returns the bytes read so far and the total.
	Progress() (done, total int64)
}

// Open returns the Source of files in format. cfg says how to cut io_steps (it
// is not used for frame files, which are already cut).
func Open(format string, files []string, cfg steps.Config) (Source, error) {
	if len(files) == 0 {
		return nil, errors.New("no input files given")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("input %w", err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var read func(context.Context, []string, *steps.Builder) error
	switch format {
	case FormatTAU:
		read = tautrace.Read
	case FormatCaliper:
		read = caliper.Read
	case FormatChrome:
		read = chrome.Read
	case FormatOTF2:
		read = otf2.Read
	case FormatFrames:
		return OpenFrames(files)
	default:
		return nil, fmt.Errorf("unknown format %q (want one of %s)", format, strings.Join(Formats, ", "))
	}
	return &traceSource{files: files, cfg: cfg, read: read}, nil
}

type traceSource struct {
	files []string
	cfg   steps.Config
	read  func(context.Context, []string, *steps.Builder) error
}

func (s *traceSource) Frames(ctx context.Context, emit func(*frame.Frame) error) (Stats, error) {
	b := steps.New(s.cfg, emit)
	err := s.read(ctx, s.files, b)
	st := b.Stats()
	if err == nil && st.Events == 0 {
		err = fmt.Errorf("%w (%d input events read, none a function, counter or message event)", ErrNothingUsable, st.InputEvents)
	}
	return st, err
}

// FrameFiles is a Source of Kipimo binary frame files (any number per rank).
// Frames are yielded in order of step start time across files, so a paced
// replay sends every rank's step s before any rank's step s+1.
type FrameFiles struct {
	paths []string
	total int64
	done  int64
}

// OpenFrames returns the Source of frame files; a directory stands for its
// *.frames files.
func OpenFrames(paths []string) (*FrameFiles, error) {
	var files []string
	var total int64
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("frames: %w", err)
		}
		if st.IsDir() {
			m, _ := filepath.Glob(filepath.Join(p, "*.frames"))
			if len(m) == 0 {
				return nil, fmt.Errorf("frames: no *.frames files in directory %s", p)
			}
			sort.Strings(m)
			for _, f := range m {
				if fs, err := os.Stat(f); err == nil {
					total += fs.Size()
				}
			}
			files = append(files, m...)
			continue
		}
		total += st.Size()
		files = append(files, p)
	}
	return &FrameFiles{paths: files, total: total}, nil
}

// Progress implements Sizer.
func (s *FrameFiles) Progress() (done, total int64) { return s.done, s.total }

// frameCursor is where one frame file is read: the order key (io_step and
// its start) and place of its next frame, nothing of the frame itself, so
// that a replay of thousands of files keeps no decoded frame per file.
type frameCursor struct {
	name   string
	order  int // the file's place among those given
	fh     *os.File
	off    int64 // offset of the next frame
	size   int64 // the file's size
	frames int   // frames read before the next one
	step   uint64
	tstart uint64
	length int // the next frame's whole size
}

// errAt is the error of c's next frame.
func (c *frameCursor) errAt(err error) error {
	var de *frame.DecodeError
	if errors.As(err, &de) {
		cp := *de
		cp.Offset += int(c.off)
		err = &cp
	}
	return fmt.Errorf("%s: frame %d: %w (%w; the frames before it were read)", c.name, c.frames, err, steps.ErrStopped)
}

// peek reads the prelude of c's next frame, if any.
func (c *frameCursor) peek(pre *frame.Frame) (bool, error) {
	if c.off >= c.size {
		return false, nil
	}
	var b [frame.PreludeSize]byte
	n, err := c.fh.ReadAt(b[:], c.off)
	if err != nil && err != io.EOF {
		return false, fmt.Errorf("%s: read frame %d: %w", c.name, c.frames, err)
	}
	length, err := frame.DecodePrelude(b[:n], pre)
	if err != nil {
		return false, c.errAt(err)
	}
	c.step, c.tstart, c.length = pre.Step, pre.TStart, length
	return true, nil
}

// read decodes c's next frame into f, with buf as its bytes' buffer.
func (c *frameCursor) read(f *frame.Frame, buf []byte) ([]byte, error) {
	buf = slices.Grow(buf[:0], c.length)[:c.length]
	n, err := c.fh.ReadAt(buf, c.off)
	if n < c.length && err != io.EOF {
		return buf, fmt.Errorf("%s: read frame %d: %w", c.name, c.frames, err)
	}
	// A file that ends inside the frame: the decoder says where.
	if _, err := frame.DecodeBinary(buf[:n], f); err != nil {
		return buf, c.errAt(err)
	}
	c.off += int64(c.length)
	c.frames++
	return buf, nil
}

// Frames implements Source. Each file's next frame is known by its
// prelude only; the frame to yield is read and decoded into one frame
// shared by all files.
func (s *FrameFiles) Frames(ctx context.Context, emit func(*frame.Frame) error) (Stats, error) {
	var st Stats
	threads := map[[2]uint32]bool{}
	gpu := map[[2]uint32]bool{}
	// The cursors in a heap on (io_step, start), the file order breaking
	// ties; a cursor leaves it (and its file is closed) at its file's end.
	var cs []*frameCursor // the files not yet at their end
	defer func() {
		for _, c := range cs {
			c.fh.Close()
		}
	}()
	var f frame.Frame
	var buf []byte
	for _, p := range s.paths {
		fh, err := os.Open(p)
		if err != nil {
			return st, fmt.Errorf("frames: %w", err)
		}
		c := &frameCursor{name: p, order: len(cs), fh: fh}
		if fi, err := fh.Stat(); err == nil {
			c.size = fi.Size()
		}
		ok, err := c.peek(&f)
		if err != nil {
			fh.Close()
			return st, err
		}
		if !ok {
			fh.Close()
			continue
		}
		cs = append(cs, c)
	}
	h := kmerge.New(cs, byStep)
	for h.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		c := h.Top()
		var err error
		if buf, err = c.read(&f, buf); err != nil {
			return st, err
		}
		s.done += int64(c.length)
		st.Frames++
		st.Events += f.NumEvents()
		for _, e := range f.Events {
			threads[[2]uint32{f.Rank, e.Tid}] = true
			if e.Kind == frame.Exit {
				st.Executions++
			}
		}
		for _, m := range f.Metadata {
			if isStreamKey(m.Key) {
				gpu[[2]uint32{f.Rank, m.Tid}] = true
			}
		}
		if err := emit(&f); err != nil {
			return st, err
		}
		var pre frame.Frame
		ok, err := c.peek(&pre)
		if err != nil {
			return st, err
		}
		if ok {
			h.Fix()
		} else {
			c.fh.Close()
			h.Pop()
			cs = h.Items()
		}
	}
	st.Threads, st.GPUThreads = len(threads), len(gpu)
	st.InputEvents = st.Events
	return st, nil
}

// byStep orders frame files by their next frame's io_step, then its start
// time, then the order the files were given in.
func byStep(a, b *frameCursor) bool {
	if a.step != b.step {
		return a.step < b.step
	}
	if a.tstart != b.tstart {
		return a.tstart < b.tstart
	}
	return a.order < b.order
}

func isStreamKey(k string) bool {
	for _, api := range []string{"CUDA", "ROCm", "OpenCL", "SYCL", "GPU"} {
		if k == api+steps.KeyStream {
			return true
		}
	}
	return false
}

// RankFile is the frame file of rank r in dir, as `kipimo gen` names it.
func RankFile(dir string, rank uint32) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%d.frames", rank))
}

// Convert writes the frames of src to dir, one file per rank (see RankFile),
// and returns the source's stats. Files are complete up to the last frame
// written even when src fails.
func Convert(ctx context.Context, src Source, dir string) (Stats, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stats{}, fmt.Errorf("output directory: %w", err)
	}
	type out struct {
		fh *os.File
		w  *frame.Writer
	}
	outs := map[uint32]*out{}
	closeAll := func() error {
		var first error
		for _, o := range outs {
			if err := o.w.Flush(); err != nil && first == nil {
				first = err
			}
			if err := o.fh.Close(); err != nil && first == nil {
				first = fmt.Errorf("close frame file: %w", err)
			}
		}
		return first
	}
	st, err := src.Frames(ctx, func(f *frame.Frame) error {
		o, ok := outs[f.Rank]
		if !ok {
			fh, err := os.Create(RankFile(dir, f.Rank))
			if err != nil {
				return fmt.Errorf("create frame file: %w", err)
			}
			o = &out{fh: fh, w: frame.NewWriter(fh)}
			outs[f.Rank] = o
		}
		return o.w.Write(f)
	})
	if cerr := closeAll(); err == nil {
		err = cerr
	}
	return st, err
}
