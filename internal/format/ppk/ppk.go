// Package ppk reads ParaProf's packed profile (.ppk, paraprof --pack): the
// single-file form of a TAU trial, a big-endian Java DataOutputStream,
// usually gzip-compressed (the gzip magic is detected).
//
// What is read: the version 2 layout (the one ParaProf writes), with a
// compatibility level up to 2, ParaProf's own rule; the trial and per-thread
// metadata of the header; the metrics, groups, functions with their group
// lists and user events; per thread and function the calls, subroutines and
// exclusive and inclusive value of every metric; per thread and user event
// the samples, minimum, maximum, mean and sum of squares. Read returns them
// as TAU profile files (tauprofile.File), one per thread and metric, so that
// one merge (internal/taudb's BuildTrial) builds trials from every TAU
// format. Strings are Java's modified UTF-8 (surrogate pairs decoded);
// negative times are read as 0, as TAU's reader reads them.
//
// Limits: other versions are refused with the version named; every count is
// bounded (16,777,216) before anything is allocated for it; errors are
// *OffsetError naming the file and the byte offset (in the uncompressed
// stream for a gzip file) where reading failed.
package ppk

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"unicode/utf16"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// Magic is how an uncompressed ppk starts: "PPK" as three Java chars
// (UTF-16BE).
const Magic = "\x00P\x00P\x00K"

// maxCount bounds every count read from a ppk, so a corrupt count fails
// with an error instead of a huge allocation.
const maxCount = 1 << 24

// OffsetError is malformed binary input: the file, the byte offset where
// reading failed (in the uncompressed stream when Compressed) and what was
// expected there.
type OffsetError struct {
	File       string
	Offset     int64
	Compressed bool
	Msg        string
}

func (e *OffsetError) Error() string {
	where := "byte"
	if e.Compressed {
		where = "uncompressed byte"
	}
	return fmt.Sprintf("%s: %s %d: %s", e.File, where, e.Offset, e.Msg)
}

// reader decodes Java DataOutputStream values, counting bytes.
type reader struct {
	r    *bufio.Reader
	off  int64
	name string
	gz   bool
	buf  [8]byte
}

func (p *reader) fail(at int64, format string, args ...any) error {
	return &OffsetError{File: p.name, Offset: at, Compressed: p.gz, Msg: fmt.Sprintf(format, args...)}
}

func (p *reader) read(n int, what string) ([]byte, error) {
	at := p.off
	got, err := io.ReadFull(p.r, p.buf[:n])
	p.off += int64(got)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, p.fail(at, "unexpected end of data, expected %s", what)
		}
		return nil, p.fail(at, "read %s: %v", what, err)
	}
	return p.buf[:n], nil
}

func (p *reader) int32(what string) (int32, error) {
	b, err := p.read(4, what)
	if err != nil {
		return 0, err
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

func (p *reader) count(what string) (int, error) {
	at := p.off
	n, err := p.int32(what)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > maxCount {
		return 0, p.fail(at, "%s is %d, want 0..%d", what, n, maxCount)
	}
	return int(n), nil
}

func (p *reader) float64(what string) (float64, error) {
	b, err := p.read(8, what)
	if err != nil {
		return 0, err
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
}

// utf reads a DataOutputStream.writeUTF string: a u16 length and modified
// UTF-8 (NUL as C0 80, supplementary characters as two 3-byte surrogates).
func (p *reader) utf(what string) (string, error) {
	b, err := p.read(2, what+" length")
	if err != nil {
		return "", err
	}
	n := int(binary.BigEndian.Uint16(b))
	at := p.off
	data := make([]byte, n)
	got, err := io.ReadFull(p.r, data)
	p.off += int64(got)
	if err != nil {
		return "", p.fail(at, "unexpected end of data in %s (%d of %d bytes)", what, got, n)
	}
	s, bad := decodeModifiedUTF8(data)
	if bad >= 0 {
		return "", p.fail(at+int64(bad), "invalid modified UTF-8 in %s", what)
	}
	return s, nil
}

// decodeModifiedUTF8 decodes Java's modified UTF-8; bad is the index of the
// first invalid byte, or -1.
func decodeModifiedUTF8(b []byte) (s string, bad int) {
	ascii := true
	for _, c := range b {
		if c == 0 || c >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return string(b), -1
	}
	units := make([]uint16, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c != 0 && c < 0x80:
			units = append(units, uint16(c))
			i++
		case c&0xE0 == 0xC0:
			if i+1 >= len(b) || b[i+1]&0xC0 != 0x80 {
				return "", i
			}
			units = append(units, uint16(c&0x1F)<<6|uint16(b[i+1]&0x3F))
			i += 2
		case c&0xF0 == 0xE0:
			if i+2 >= len(b) || b[i+1]&0xC0 != 0x80 || b[i+2]&0xC0 != 0x80 {
				return "", i
			}
			units = append(units, uint16(c&0x0F)<<12|uint16(b[i+1]&0x3F)<<6|uint16(b[i+2]&0x3F))
			i += 3
		default:
			return "", i
		}
	}
	return string(utf16.Decode(units)), -1
}

// headerThread is one thread's header entry.
type headerThread struct {
	node, context, thread int
	metadata              []tauprofile.Attribute
}

// Read reads a ParaProf packed profile (gzip-compressed or not). sets[m]
// holds the files of metric m, one per thread in file order, each with the
// trial metadata followed by the thread's own after "Metric Name"; file is
// used in errors, which are *OffsetError for malformed content.
func Read(r io.Reader, file string) (sets [][]*tauprofile.File, err error) {
	br := bufio.NewReaderSize(r, 64*1024)
	gz := false
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, &OffsetError{File: file, Offset: 0, Msg: fmt.Sprintf("gzip header: %v", err)}
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 64*1024)
		gz = true
	}
	p := &reader{r: br, name: file, gz: gz}
	return p.decode()
}

func (p *reader) decode() ([][]*tauprofile.File, error) {
	magic, err := p.read(6, `"PPK" magic`)
	if err != nil {
		return nil, err
	}
	if string(magic) != Magic {
		return nil, p.fail(0, `expected "PPK" as Java chars (00 50 00 50 00 4B), got % x`, magic)
	}
	at := p.off
	version, err := p.int32("version")
	if err != nil {
		return nil, err
	}
	if version != 2 {
		return nil, p.fail(at, "ppk version %d; this reader reads the version 2 layout", version)
	}
	at = p.off
	compat, err := p.int32("compatibility level")
	if err != nil {
		return nil, err
	}
	if compat > 2 {
		return nil, p.fail(at, "ppk compatibility level %d is newer than this reader (2)", compat)
	}
	headerSize, err := p.count("header size")
	if err != nil {
		return nil, err
	}
	headerStart := p.off
	if _, err := p.int32("header skip field"); err != nil {
		return nil, err
	}
	trialMD, err := p.attributes("trial metadata")
	if err != nil {
		return nil, err
	}
	nth, err := p.count("header thread count")
	if err != nil {
		return nil, err
	}
	headerThreads := map[[3]int]*headerThread{}
	for i := 0; i < nth; i++ {
		var t headerThread
		if t.node, t.context, t.thread, err = p.nct("header thread"); err != nil {
			return nil, err
		}
		if t.metadata, err = p.attributes("thread metadata"); err != nil {
			return nil, err
		}
		headerThreads[[3]int{t.node, t.context, t.thread}] = &t
	}
	if p.off-headerStart != int64(headerSize) {
		return nil, p.fail(headerStart, "header size field says %d bytes, the header holds %d", headerSize, p.off-headerStart)
	}
	metrics, err := p.names("metric")
	if err != nil {
		return nil, err
	}
	if len(metrics) == 0 {
		return nil, p.fail(p.off-4, "the profile has no metrics")
	}
	groups, err := p.names("group")
	if err != nil {
		return nil, err
	}
	nf, err := p.count("function count")
	if err != nil {
		return nil, err
	}
	type fn struct{ name, groups string }
	funcs := make([]fn, nf)
	for i := range funcs {
		if funcs[i].name, err = p.utf("function name"); err != nil {
			return nil, err
		}
		ng, err := p.count("function group count")
		if err != nil {
			return nil, err
		}
		for j := 0; j < ng; j++ {
			at := p.off
			g, err := p.int32("group index")
			if err != nil {
				return nil, err
			}
			if g < 0 || int(g) >= len(groups) {
				return nil, p.fail(at, "group index %d out of range 0..%d", g, len(groups)-1)
			}
			if j > 0 {
				funcs[i].groups += " | "
			}
			funcs[i].groups += groups[g]
		}
	}
	events, err := p.names("user event")
	if err != nil {
		return nil, err
	}
	sets := make([][]*tauprofile.File, len(metrics))
	nthreads, err := p.count("thread count")
	if err != nil {
		return nil, err
	}
	for i := 0; i < nthreads; i++ {
		n, c, t, err := p.nct("thread")
		if err != nil {
			return nil, err
		}
		md := append([]tauprofile.Attribute(nil), trialMD...)
		if h := headerThreads[[3]int{n, c, t}]; h != nil {
			md = append(md, h.metadata...)
		}
		files := make([]*tauprofile.File, len(metrics))
		for mi, m := range metrics {
			files[mi] = &tauprofile.File{Node: n, Context: c, Thread: t, Header: "templated_functions_MULTI_" + m,
				Metadata: append([]tauprofile.Attribute{{Name: tauprofile.MetricNameKey, Value: m}}, md...)}
			sets[mi] = append(sets[mi], files[mi])
		}
		nfp, err := p.count("function profile count")
		if err != nil {
			return nil, err
		}
		for j := 0; j < nfp; j++ {
			at := p.off
			fi, err := p.int32("function index")
			if err != nil {
				return nil, err
			}
			if fi < 0 || int(fi) >= len(funcs) {
				return nil, p.fail(at, "function index %d out of range 0..%d", fi, len(funcs)-1)
			}
			calls, err := p.float64("calls")
			if err != nil {
				return nil, err
			}
			subrs, err := p.float64("subroutines")
			if err != nil {
				return nil, err
			}
			for mi := range metrics {
				excl, err := p.float64("exclusive value")
				if err != nil {
					return nil, err
				}
				incl, err := p.float64("inclusive value")
				if err != nil {
					return nil, err
				}
				files[mi].Functions = append(files[mi].Functions, tauprofile.FunctionLine{Name: funcs[fi].name, Groups: funcs[fi].groups,
					Calls: calls, Subrs: subrs, Exclusive: tauprofile.ClampNegative(excl), Inclusive: tauprofile.ClampNegative(incl)})
			}
		}
		nue, err := p.count("user event profile count")
		if err != nil {
			return nil, err
		}
		for j := 0; j < nue; j++ {
			at := p.off
			ui, err := p.int32("user event index")
			if err != nil {
				return nil, err
			}
			if ui < 0 || int(ui) >= len(events) {
				return nil, p.fail(at, "user event index %d out of range 0..%d", ui, len(events)-1)
			}
			ns, err := p.int32("sample count")
			if err != nil {
				return nil, err
			}
			var v [4]float64 // min, max, mean, sum of squares
			for k, what := range [4]string{"minimum", "maximum", "mean", "sum of squares"} {
				if v[k], err = p.float64(what); err != nil {
					return nil, err
				}
			}
			e := tauprofile.UserEventLine{Name: events[ui], NumEvents: float64(ns), Min: v[0], Max: v[1], Mean: v[2], SumSquare: v[3]}
			for _, f := range files {
				f.UserEvents = append(f.UserEvents, e)
			}
		}
	}
	if nthreads == 0 {
		return nil, p.fail(p.off-4, "the profile has no threads")
	}
	if _, err := p.r.ReadByte(); err == nil {
		return nil, p.fail(p.off, "unexpected data after the last thread")
	} else if !errors.Is(err, io.EOF) {
		return nil, p.fail(p.off, "read: %v", err)
	}
	return sets, nil
}

func (p *reader) nct(what string) (n, c, t int, err error) {
	var v [3]int32
	for i, part := range [3]string{"node", "context", "thread"} {
		at := p.off
		if v[i], err = p.int32(what + " " + part); err != nil {
			return 0, 0, 0, err
		}
		if v[i] < 0 {
			return 0, 0, 0, p.fail(at, "%s %s is %d, want >= 0", what, part, v[i])
		}
	}
	return int(v[0]), int(v[1]), int(v[2]), nil
}

func (p *reader) attributes(what string) ([]tauprofile.Attribute, error) {
	n, err := p.count(what + " count")
	if err != nil {
		return nil, err
	}
	out := make([]tauprofile.Attribute, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		k, err := p.utf(what + " name")
		if err != nil {
			return nil, err
		}
		v, err := p.utf(what + " value")
		if err != nil {
			return nil, err
		}
		out = append(out, tauprofile.Attribute{Name: k, Value: v})
	}
	return out, nil
}

func (p *reader) names(what string) ([]string, error) {
	n, err := p.count(what + " count")
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		s, err := p.utf(what + " name")
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
