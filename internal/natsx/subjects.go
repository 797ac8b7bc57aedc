// Package natsx holds what every Kipimo process needs from NATS: the subject
// names of a run, an embedded server for runs with nothing installed, and
// connection helpers with clear errors.
package natsx

import "fmt"

// ProvStream is the JetStream stream that holds a run's provenance subjects.
func ProvStream(run string) string { return "KIPIMO_PROV_" + run }

// FrameStream is the JetStream stream that holds a run's frames when
// detectors read them durably.
func FrameStream(run string) string { return "KIPIMO_FRAMES_" + run }

// CheckpointBucket is the JetStream object store of a run's detector
// checkpoints.
func CheckpointBucket(run string) string { return "KIPIMO_CKPT_" + run }

// Subjects are the NATS subjects of one run. The run id must be a single
// subject token: letters, digits, '-' and '_'.
type Subjects struct{ Run string }

// Frames is the subject a rank's frames are published on.
func (s Subjects) Frames(pid, rank uint32) string {
	return fmt.Sprintf("kipimo.%s.frames.%d.%d", s.Run, pid, rank)
}

// FramesPrefix is what every rank's frame subject starts with, before
// "<pid>.<rank>".
func (s Subjects) FramesPrefix() string { return "kipimo." + s.Run + ".frames." }

// AllFrames matches every rank's frame subject.
func (s Subjects) AllFrames() string { return "kipimo." + s.Run + ".frames.>" }

// Sync is the parameter-server request subject of a shard.
func (s Subjects) Sync(shard int) string { return fmt.Sprintf("kipimo.%s.ps.sync.%d", s.Run, shard) }

// PSWAL is the subject of a parameter-server shard's write-ahead log of sync
// requests (stream KIPIMO_PSWAL_<run>).
func (s Subjects) PSWAL(shard int) string { return fmt.Sprintf("kipimo.%s.pswal.%d", s.Run, shard) }

// AllPSWAL matches every shard's write-ahead-log subject of the run.
func (s Subjects) AllPSWAL() string { return "kipimo." + s.Run + ".pswal.*" }

// Prov is the provenance subject of one kind of record (its collection
// name, a provenance.Kind).
func (s Subjects) Prov(kind string) string { return "kipimo." + s.Run + ".prov." + kind }

// AllProv matches every provenance subject of the run.
func (s Subjects) AllProv() string { return "kipimo." + s.Run + ".prov.>" }

// Callstack is the live call-stack probe subject of one detector.
func (s Subjects) Callstack(pid, rank uint32) string {
	return fmt.Sprintf("kipimo.%s.ad.%d.%d.callstack", s.Run, pid, rank)
}

// AllCallstacks is the subject a scatter-gather call-stack probe publishes on;
// every detector of the run also subscribes to it.
func (s Subjects) AllCallstacks() string { return "kipimo." + s.Run + ".ad.callstack" }

// Control carries run-wide control messages (end of run, snapshots).
func (s Subjects) Control() string { return "kipimo." + s.Run + ".control" }

// ValidRun reports whether run can be used as a subject token.
func ValidRun(run string) error {
	if run == "" {
		return fmt.Errorf("run id is empty")
	}
	for i, r := range run {
		ok := r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("run id %q: character %q at %d is not allowed (letters, digits, '-' and '_' only)", run, r, i)
		}
	}
	return nil
}
