package pgtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Skip(args ...any)                  { f.skipped = fmt.Sprint(args...) }
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestUnavailableSkipsUnlessRequired(t *testing.T) {
	cases := []struct {
		name, require   string
		skipped, failed bool
	}{
		{"not required", "", true, false},
		{"required", "1", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KIPIMO_REQUIRE_PG", tc.require)
			f := &fakeTB{TB: t}
			unavailable(f, errors.New("no initdb"))
			if (f.skipped != "") != tc.skipped || (f.failed != "") != tc.failed {
				t.Fatalf("skipped %q, failed %q", f.skipped, f.failed)
			}
			msg := f.skipped + f.failed
			if !strings.Contains(msg, "no initdb") || !strings.Contains(msg, "apt-get install -y postgresql") {
				t.Errorf("message %q does not say what is missing and how to get it", msg)
			}
		})
	}
}

func TestIsolatedServer(t *testing.T) {
	dsn := Isolated(t)
	if !strings.Contains(dsn, "kipimo_test_") {
		t.Errorf("DSN %q does not name a fresh test database", dsn)
	}
}
