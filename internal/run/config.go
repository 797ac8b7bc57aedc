// Package run wires Kipimo's whole pipeline into one process: an embedded NATS
// server with JetStream, the parameter server with its dashboard, the
// provenance service on the SQLite store, one detector per rank, the input
// (a synthetic workload with ground truth, or traces made by other tools)
// published on the frame subjects, and the summary writer. It is what
// `kipimo run` and `kipimo bench` execute.
package run

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// Config configures a run. The zero value plus Validate gives the default
// run: the synthetic workload's defaults, detected with the detector's
// defaults (ad.Config).
type Config struct {
	// Out is the directory under which each run keeps, in Out/<RunID>,
	// its NATS data, provenance store, TAU profiles and ground truth.
	Out string
	// RunID names the run on the NATS subjects and its directory under
	// Out; default run-<UTC time>, with -2, -3... added when a run of that
	// id is already there. A given RunID whose directory holds an earlier
	// run is refused unless Replace is set.
	RunID string
	// Replace deletes an earlier run of the same RunID (its directory
	// under Out and, on an external NATS server, its provenance stream)
	// before the run starts, instead of refusing the id.
	Replace bool

	// Workload is the synthetic run, used when Inputs is empty.
	Workload workload.Config
	// Live, when its Command is set, runs that command with the event
	// library preloaded and monitors it live instead of a synthetic run.
	Live LiveConfig

	// Inputs are trace files of InputFormat (replay.Formats) to run instead.
	Inputs      []string
	InputFormat string
	// Step cuts traces into io_steps of this much trace time (default 1s);
	// StepMarker cuts at each entry of that function instead.
	Step       time.Duration
	StepMarker string

	// Detector configures every detector (algorithm, thresholds, window).
	// PID, Rank, Syncer and Sink are set by the run.
	Detector ad.Config

	// HTTP is the dashboard's address; default 127.0.0.1 and a free port.
	HTTP string
	// TaudbDSN, when set, also stores the run's profile as a TAUdb trial.
	TaudbDSN string
	// MaxLag is how many frames a rank's input may run ahead of its
	// detector before the input waits (back-pressure); 0 chooses
	// (Config.lag).
	MaxLag int
	// NATSURL, when set, uses that NATS server instead of an embedded one.
	NATSURL string
	// NATSAuth is how the run proves who it is to the NATS server of
	// NATSURL (the daemons' --nats-creds, --nats-user... flags).
	NATSAuth daemon.NATSAuth
	// KeepNATS keeps the embedded NATS server's JetStream data (the run
	// directory's nats/) after the run. By default it is deleted once the
	// run is over: everything the run keeps is in the provenance store.
	KeepNATS bool
	// Pace replays the input at this multiple of its recorded speed
	// (1 = real time); 0 publishes as fast as the detectors take it.
	Pace float64

	// Evaluation workloads (kipimo run --from, --profile).
	//
	// From, when it names applications' traces, runs a replay of them
	// (workload.FromTraces: their call trees and exclusive times cycle
	// after cycle, with injected anomalies) instead of the synthetic run,
	// scored against its truth the same way. The synthetic run's profile
	// is Workload.Profile.
	From workload.TraceConfig

	// hooks are this package's test seams; nil in every other use.
	hooks *testHooks
	// autoID is set by Validate when it chose RunID.
	autoID bool
}

// testHooks let this package's tests act inside a run.
type testHooks struct {
	// afterReady runs once the detectors listen and before the input is
	// published (tests inject faults there).
	afterReady func()
	// wrapSink wraps the sink the detectors publish their records to
	// (tests slow a detector down there).
	wrapSink func(ad.Sink) ad.Sink
	// onCommandExit runs as soon as a live run's command has exited,
	// before its streams are ended (tests look at the dashboard there).
	onCommandExit func()
}

// Validate checks c and fills its defaults.
func (c *Config) Validate() error {
	if c.Out == "" {
		c.Out = "kipimo-out"
	}
	if c.RunID == "" {
		c.RunID = "run-" + time.Now().UTC().Format("20060102-150405")
		c.autoID = true
	}
	if err := natsx.ValidRun(c.RunID); err != nil {
		return err
	}
	if len(c.Live.Command) > 0 {
		if len(c.Inputs) > 0 {
			return errors.New("a command to run (--exec) and input traces (--input) exclude each other")
		}
		if c.Live.Period < 0 || (c.Live.Period > 0 && c.Live.Period < time.Millisecond) {
			return fmt.Errorf("period %s: want at least 1ms", c.Live.Period)
		}
		if len(c.From.Apps) > 0 {
			return errors.New("a command to run (--exec) and traces to replay (--from) exclude each other")
		}
	} else if len(c.From.Apps) > 0 {
		if len(c.Inputs) > 0 {
			return errors.New("traces to replay (--from) and input traces (--input) exclude each other")
		}
		if err := c.From.Validate(); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
	} else if len(c.Inputs) == 0 {
		if c.Workload.Ranks == 0 {
			c.Workload = workload.DefaultConfig()
		}
		if err := c.Workload.Validate(); err != nil {
			return fmt.Errorf("workload: %w", err)
		}
	} else {
		ok := false
		for _, f := range replay.Formats {
			ok = ok || f == c.InputFormat
		}
		if !ok {
			return fmt.Errorf("input format %q is not one of %v", c.InputFormat, replay.Formats)
		}
	}
	probe := c.Detector
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("detector: %w", err)
	}
	if c.HTTP == "" {
		c.HTTP = "127.0.0.1:0"
	}
	if c.MaxLag < 0 {
		return errors.New("max-lag must not be negative")
	}
	if c.Pace < 0 {
		return errors.New("pace must not be negative")
	}
	if c.Step < 0 {
		return errors.New("step duration must not be negative")
	}
	return nil
}

func (c *Config) path(name string) string { return filepath.Join(c.Out, c.RunID, name) }

// Chosen bounds of MaxLag: frames a rank's input may run ahead of its
// detector, and frames in flight over all ranks.
const (
	maxAutoLag      = 16
	minAutoLag      = 2
	autoLagInFlight = 4096
)

// lag is MaxLag, or when it is 0 the bound chosen for ranks: 16 frames per
// rank up to 256 ranks, then as many as keep 4,096 frames in flight in all,
// but at least 2. A frame published ahead waits, encoded, in its
// detector's queue, so at thousands of ranks a lag of 16 would hold
// gigabytes that the detectors, in lockstep, cannot use: no rank goes past
// a step before every rank has finished the one before.
func (c Config) lag(ranks int) int {
	if c.MaxLag > 0 {
		return c.MaxLag
	}
	return max(minAutoLag, min(maxAutoLag, autoLagInFlight/max(1, ranks)))
}
