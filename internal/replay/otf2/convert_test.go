package otf2_test

import (
	"context"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// TestConvertThroughReplay opens the Score-P trace as --format otf2 does,
// writes it as frame files and reads them back: the frame files hold what
// the reader produced (2 ranks; 116 events: 84 entries and exits and 32
// messages, as otf2-print shows the trace).
func TestConvertThroughReplay(t *testing.T) {
	src, err := replay.Open(replay.FormatOTF2, []string{"testdata/ping-pong"}, steps.Config{Step: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := replay.Convert(context.Background(), src, dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Events != 116 || st.Executions != 42 || st.InputEvents != 120 {
		t.Errorf("stats %+v: want 116 events, 42 executions, 120 input events", st)
	}
	back, err := replay.OpenFrames([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	ranks := map[uint32]bool{}
	comms := 0
	bst, err := back.Frames(context.Background(), func(f *frame.Frame) error {
		ranks[f.Rank] = true
		comms += len(f.Comms)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if bst.Frames != st.Frames || bst.Events != st.Events || bst.Executions != st.Executions || len(ranks) != 2 || comms != 32 {
		t.Errorf("read back %+v, %d ranks, %d messages; wrote %+v", bst, len(ranks), comms, st)
	}
}
