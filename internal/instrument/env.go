package instrument

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Injection is one fault to inject: the library sleeps Delay inside Func
// with probability Prob per call, and records each such call as ground truth.
// Ranks, when set, limits it to those ranks.
type Injection struct {
	Func  string
	Prob  float64
	Delay time.Duration
	Ranks []RankRange
}

// RankRange is an inclusive range of ranks.
type RankRange struct{ First, Last uint32 }

// String is the FUNC:PROB:DELAY[@RANKS] form ParseInjection reads.
func (in Injection) String() string {
	return in.Func + ":" + strconv.FormatFloat(in.Prob, 'g', -1, 64) + ":" + in.Delay.String() + in.rankSuffix()
}

// rankSuffix is "@RANKS", or "" for every rank.
func (in Injection) rankSuffix() string {
	s := ""
	for i, r := range in.Ranks {
		sep := "+"
		if i == 0 {
			sep = "@"
		}
		s += sep + strconv.FormatUint(uint64(r.First), 10)
		if r.Last != r.First {
			s += "-" + strconv.FormatUint(uint64(r.Last), 10)
		}
	}
	return s
}

// ParseInjection reads FUNC:PROB:DELAY[@RANKS], e.g. MPI_Send:0.004:25ms or
// compute:0.05:20ms@2. FUNC may itself contain colons (C++ names): the last
// two fields are split off. RANKS limits the injection to ranks and ranges
// R-R joined by '+' (e.g. 0-1+6).
func ParseInjection(s string) (Injection, error) {
	var ranks []RankRange
	if at := strings.LastIndexByte(s, '@'); at >= 0 && at > strings.LastIndexByte(s, ':') {
		var err error
		if ranks, err = parseRankRanges(s[at+1:]); err != nil {
			return Injection{}, fmt.Errorf("injection %q: %w", s, err)
		}
		s = s[:at]
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Injection{}, fmt.Errorf("injection %q: want FUNC:PROB:DELAY (e.g. MPI_Send:0.004:25ms)", s)
	}
	j := strings.LastIndexByte(s[:i], ':')
	if j <= 0 {
		return Injection{}, fmt.Errorf("injection %q: want FUNC:PROB:DELAY (e.g. MPI_Send:0.004:25ms)", s)
	}
	in := Injection{Func: s[:j], Ranks: ranks}
	p, err := strconv.ParseFloat(s[j+1:i], 64)
	if err != nil || p <= 0 || p > 1 {
		return Injection{}, fmt.Errorf("injection %q: probability %q is not a number in (0, 1]", s, s[j+1:i])
	}
	in.Prob = p
	d, err := time.ParseDuration(s[i+1:])
	if err != nil || d <= 0 {
		return Injection{}, fmt.Errorf("injection %q: delay %q is not a positive duration such as 25ms", s, s[i+1:])
	}
	in.Delay = d
	return in, nil
}

// parseRankRanges reads RANKS of an injection: R or R-R, joined by '+'.
func parseRankRanges(s string) ([]RankRange, error) {
	var out []RankRange
	for part := range strings.SplitSeq(s, "+") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("rank %q after @ is not a rank: want R or R-R joined by + (e.g. @2 or @0-1+6)", part)
		}
		last := first
		if isRange {
			if last, err = strconv.ParseUint(hi, 10, 32); err != nil || last < first {
				return nil, fmt.Errorf("ranks %q after @ are not a range R-R with R <= R (e.g. @0-3)", part)
			}
		}
		out = append(out, RankRange{uint32(first), uint32(last)})
	}
	return out, nil
}

// Env is what the library needs to know about a run; Environ turns it into
// environment variables.
type Env struct {
	// NATSURL is the (node-local) NATS server the frames go to.
	NATSURL string
	// Run is the run id; PID the program id on the subjects.
	Run string
	PID uint32
	// Period is the io_step length (default 1s).
	Period time.Duration
	// Exclude are shell patterns of function names not recorded.
	Exclude []string
	// Inject are the faults to inject; Seed seeds their draws.
	Inject []Injection
	Seed   uint64
	// StatusDir, when set, receives one status file per process at its exit.
	StatusDir string
	// BufferEvents is the per-thread ring size (0: the library's default).
	BufferEvents int
	// QueueBytes bounds the encoded frames waiting to be sent (0: default).
	QueueBytes int64
	// NoCounters turns off the per-step process counters.
	NoCounters bool
	// NamesEvery makes every NamesEvery-th frame carry every function,
	// counter and metadata entry again, for consumers that start late (0:
	// the library's default, 16; negative: only after a reconnect or a
	// dropped frame).
	NamesEvery int
}

// Environ returns base with the variables that load the library into a
// program and describe the run to it. An LD_PRELOAD already in base is kept,
// after the library. The zero Library (a program run uninstrumented) adds
// nothing.
func (l *Library) Environ(e Env, base []string) []string {
	if l.Core == "" {
		return base
	}
	set := map[string]string{
		"KIPIMO_NATS": e.NATSURL,
		"KIPIMO_RUN":  e.Run,
		"KIPIMO_PID":  strconv.FormatUint(uint64(e.PID), 10),
	}
	if e.Period > 0 {
		set["KIPIMO_PERIOD"] = strconv.FormatInt(e.Period.Microseconds(), 10) + "us"
	}
	if len(e.Exclude) > 0 {
		set["KIPIMO_EXCLUDE"] = strings.Join(e.Exclude, ",")
	}
	if len(e.Inject) > 0 {
		parts := make([]string, len(e.Inject))
		for i, in := range e.Inject {
			parts[i] = in.Func + ":" + strconv.FormatFloat(in.Prob, 'g', -1, 64) + ":" + strconv.FormatInt(in.Delay.Microseconds(), 10) + "us" + in.rankSuffix()
		}
		set["KIPIMO_INJECT"] = strings.Join(parts, ",")
		set["KIPIMO_SEED"] = strconv.FormatUint(e.Seed, 10)
	}
	if e.StatusDir != "" {
		set["KIPIMO_STATUS_DIR"] = e.StatusDir
	}
	if e.BufferEvents > 0 {
		set["KIPIMO_BUFFER_EVENTS"] = strconv.Itoa(e.BufferEvents)
	}
	if e.QueueBytes > 0 {
		set["KIPIMO_QUEUE_BYTES"] = strconv.FormatInt(e.QueueBytes, 10)
	}
	if e.NoCounters {
		set["KIPIMO_COUNTERS"] = "0"
	}
	if e.NamesEvery != 0 {
		set["KIPIMO_NAMES_EVERY"] = strconv.Itoa(max(e.NamesEvery, 0))
	}
	for k, v := range l.kokkosEnv(base) {
		set[k] = v
	}
	preload := l.Preload()
	out := make([]string, 0, len(base)+len(set)+1)
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; ours {
			continue
		}
		if k == "LD_PRELOAD" {
			if v != "" {
				preload += " " + v
			}
			continue
		}
		out = append(out, kv)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+set[k])
	}
	return append(out, "LD_PRELOAD="+preload)
}

// Status is what one instrumented process reported at its exit.
type Status struct {
	Run    string `json:"run"`
	PID    uint32 `json:"pid"`
	Rank   uint32 `json:"rank"`
	OSPID  int    `json:"os_pid"`
	Thread uint32 `json:"threads"`
	// Frames cut, sent to the NATS server, and dropped (queue full, server
	// gone, or larger than the server's max_payload: OversizeFrames).
	Frames         uint64 `json:"frames"`
	FramesSent     uint64 `json:"frames_sent"`
	FramesDropped  uint64 `json:"frames_dropped"`
	OversizeFrames uint64 `json:"oversize_frames"`
	// Events encoded, and events dropped because a thread's ring was full.
	Events        uint64 `json:"events"`
	EventsDropped uint64 `json:"events_dropped"`
	// Calls summarised (hot leaves, KIPIMO_SUMMARY_RATE) and calls dropped
	// whole (full rings), as the frames reported them.
	CallsSummarised uint64 `json:"calls_summarised"`
	CallsDropped    uint64 `json:"calls_dropped"`
	BytesSent       uint64 `json:"bytes_sent"`
	Connects        uint64 `json:"connects"`
	ConnectFailures uint64 `json:"connect_failures"`
	LastError       string `json:"last_error"`
	// Injected are the calls the library delayed on purpose.
	Injected []Injected `json:"injected"`
}

// Injected is one call the library delayed: the execution's thread and
// entry time (µs, as in its frames) and the delay.
type Injected struct {
	Func    string `json:"func"`
	Tid     uint32 `json:"tid"`
	Entry   uint64 `json:"entry"`
	DelayUS uint64 `json:"delay_us"`
}

// ReadStatus reads every status file in dir, ordered by program, rank and
// process id. A directory with no status file gives none and no error.
func ReadStatus(dir string) ([]Status, error) {
	names, err := filepath.Glob(filepath.Join(dir, "status.*.json"))
	if err != nil {
		return nil, err
	}
	var out []Status
	var errs []error
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var s Status
		if err := json.Unmarshal(b, &s); err != nil {
			errs = append(errs, fmt.Errorf("status file %s: %w", n, err))
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.PID != b.PID {
			return a.PID < b.PID
		}
		if a.Rank != b.Rank {
			return a.Rank < b.Rank
		}
		return a.OSPID < b.OSPID
	})
	return out, errors.Join(errs...)
}
