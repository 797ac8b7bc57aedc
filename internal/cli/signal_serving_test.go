package cli

import (
	"bytes"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// Once a run is over and only its dashboard is kept up (--keep-serving),
// Ctrl-C stops the dashboard and says so, instead of claiming to end a run
// that has ended.
func TestCtrlCWhileOnlyServing(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	var stderr bytes.Buffer
	var serving atomic.Bool
	serving.Store(true)
	stopped, stop := watchSignals(sigs, nil, &stderr, false, &serving)
	sigs <- syscall.SIGINT
	<-stopped
	stop()
	got := stderr.String()
	if !strings.Contains(got, "SIGINT: stopping the dashboard (the run is over)") || strings.Contains(got, "ending the run") {
		t.Errorf("stderr %q, want it to say the dashboard stops", got)
	}
}
