package daemon

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int64
		bad  bool
	}{
		{"bytes", "1048576", 1 << 20, false},
		{"MiB", "1800MiB", 1800 << 20, false},
		{"GiB any case", "2gib", 2 << 30, false},
		{"fraction of GiB", "1.5GiB", 3 << 29, false},
		{"MB is decimal", "512MB", 512e6, false},
		{"short unit", "64M", 64 << 20, false},
		{"space before the unit", "2 GiB", 2 << 30, false},
		{"unit only", "GiB", 0, true},
		{"negative", "-1GiB", 0, true},
		{"not a number", "lots", 0, true},
		{"too large", "9000000TiB", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("ParseSize(%q) = %d, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestCgroupMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := write("memory.max", "2147483648\n")
	v2max := write("memory.max.unlimited", "max\n")
	v1 := write("limit_in_bytes", "1073741824\n")
	v1unlimited := write("limit_in_bytes.unlimited", "9223372036854771712\n")
	missing := filepath.Join(dir, "absent")
	tests := []struct {
		name  string
		files []string
		want  int64
	}{
		{"cgroup v2 limit", []string{v2, v1}, 2 << 30},
		{"cgroup v2 without limit", []string{v2max, v1}, 0},
		{"cgroup v1 limit", []string{missing, v1}, 1 << 30},
		{"cgroup v1 without limit", []string{missing, v1unlimited}, 0},
		{"no cgroup files", []string{missing}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := cgroupMemoryLimit(tc.files); got != tc.want {
				t.Errorf("cgroupMemoryLimit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	tests := []struct {
		name    string
		value   string
		want    int64 // limit in force afterwards
		source  string
		wantErr bool
	}{
		{"a size", "1800MiB", 1800 << 20, "--memory-limit", false},
		{"off", "off", 1<<63 - 1, "", false},
		{"too small", "1MiB", -1, "", true},
		{"garbage", "much", -1, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := debug.SetMemoryLimit(-1)
			got, err := ApplyMemoryLimit(tc.value)
			now := debug.SetMemoryLimit(-1)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ApplyMemoryLimit(%q) = %v, want an error", tc.value, got)
				}
				if now != before {
					t.Errorf("a refused value changed the limit from %d to %d", before, now)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if now != tc.want || got.Source != tc.source {
				t.Errorf("ApplyMemoryLimit(%q) = %v, limit now %d; want %d from %q", tc.value, got, now, tc.want, tc.source)
			}
		})
	}
	t.Run("auto keeps GOMEMLIMIT", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "3GiB")
		debug.SetMemoryLimit(3 << 30) // what the runtime does with it at start
		got, err := ApplyMemoryLimit("auto")
		if err != nil || got.Bytes != 3<<30 || got.Source != "GOMEMLIMIT" {
			t.Errorf("auto with GOMEMLIMIT = %v, %v", got, err)
		}
	})
}
