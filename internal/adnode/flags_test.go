package adnode

import (
	"fmt"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
)

func TestMaxHeldFramesOption(t *testing.T) {
	tests := []struct {
		name string
		in   int
		want int
		bad  bool
	}{
		{"default", 0, ad.DefaultMaxHeldFrames, false},
		{"one", 1, 1, false},
		{"negative", -1, 0, true},
		{"too many", 1<<16 + 1, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ad.Config{MaxHeldFrames: tc.in}
			err := c.Validate()
			if (err != nil) != tc.bad {
				t.Fatalf("Validate: %v, want error %v", err, tc.bad)
			}
			if err == nil && c.MaxHeldFrames != tc.want {
				t.Errorf("MaxHeldFrames %d, want %d", c.MaxHeldFrames, tc.want)
			}
		})
	}
	var c ad.Config
	fs := pflag.NewFlagSet("ad", pflag.ContinueOnError)
	AddFlags(fs, &c)
	fl := fs.Lookup("max-held-frames")
	if fl == nil || fl.DefValue != fmt.Sprint(ad.DefaultMaxHeldFrames) || fl.Usage == "" {
		t.Fatalf("flag --max-held-frames: %+v", fl)
	}
	if err := fs.Parse([]string{"--max-held-frames", "5"}); err != nil || c.MaxHeldFrames != 5 {
		t.Errorf("--max-held-frames 5: %v, %d", err, c.MaxHeldFrames)
	}
}

func TestMaxHeldBytesFlag(t *testing.T) {
	var c ad.Config
	fs := pflag.NewFlagSet("ad", pflag.ContinueOnError)
	AddFlags(fs, &c)
	fl := fs.Lookup("max-held-bytes")
	if fl == nil || fl.DefValue != "64MiB" || c.MaxHeldBytes != ad.DefaultMaxHeldBytes {
		t.Fatalf("flag --max-held-bytes: %+v, value %d", fl, c.MaxHeldBytes)
	}
	for _, tc := range []struct {
		arg  string
		want int64
		bad  bool
	}{
		{"2MiB", 2 << 20, false},
		{"1048576", 1 << 20, false},
		{"lots", 0, true},
	} {
		c.MaxHeldBytes = 0
		err := fs.Set("max-held-bytes", tc.arg)
		if (err != nil) != tc.bad || (err == nil && c.MaxHeldBytes != tc.want) {
			t.Errorf("--max-held-bytes %s: %v, %d; want %d (error %v)", tc.arg, err, c.MaxHeldBytes, tc.want, tc.bad)
		}
	}
}
