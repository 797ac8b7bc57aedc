package provdb

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A settings error names the flag and says what is wrong, without
// repeating the program's name: its main prints "provdb: --run ...".
func TestMainSettingsErrorNamesProgramOnce(t *testing.T) {
	var stderr bytes.Buffer
	err := Main(context.Background(), []string{"--run", "bad id"}, &stderr)
	if err == nil || !strings.HasPrefix(err.Error(), "--run: ") {
		t.Fatalf("error %v, want one starting with --run: ", err)
	}
	if strings.Contains(err.Error(), "provdb") {
		t.Errorf("error %q repeats the program's name", err)
	}
}
