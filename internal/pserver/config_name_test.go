package pserver

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A settings error names the flag and says what is wrong, without
// repeating the program's name: its main prints "pserver: --run ...".
func TestMainSettingsErrorNamesProgramOnce(t *testing.T) {
	var stderr bytes.Buffer
	err := Main(context.Background(), []string{"--run", "bad id", "--http", ""}, &stderr)
	if err == nil || !strings.HasPrefix(err.Error(), "--run: ") {
		t.Fatalf("error %v, want one starting with --run: ", err)
	}
	if strings.Contains(err.Error(), "pserver") {
		t.Errorf("error %q repeats the program's name", err)
	}
}
