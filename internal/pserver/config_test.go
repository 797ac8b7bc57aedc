package pserver

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestConfigValidate: the default configuration with a run id is valid, and
// each invalid setting is refused with an error naming its flag (or field,
// for settings without one). Validate changes nothing.
func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.Run = "a"
	with := func(f func(c *Config)) Config { c := valid; f(&c); return c }
	tests := []struct {
		name string
		cfg  Config
		want string // "" when valid, else a substring of the error
	}{
		{"default with a run", valid, ""},
		{"no http listener", with(func(c *Config) { c.HTTPAddr = "" }), ""},
		{"last shard", with(func(c *Config) { c.Shards, c.Shard = 4, 3 }), ""},
		{"snapshot mode", with(func(c *Config) { c.Durability = DurabilitySnapshot }), ""},
		{"memory mode", with(func(c *Config) { c.Durability = DurabilityNone }), ""},
		{"provdb over https", with(func(c *Config) { c.ProvDBURL = "https://p.example:8081/base" }), ""},
		{"no nats checked when empty", with(func(c *Config) { c.NATS = "" }), ""},
		{"no run", with(func(c *Config) { c.Run = "" }), "--run is required"},
		{"dotted run", with(func(c *Config) { c.Run = "a.b" }), "--run: run id"},
		{"bad nats scheme", with(func(c *Config) { c.NATS = "http://x:4222" }), "--nats"},
		{"zero shards", with(func(c *Config) { c.Shards = 0 }), "--shards 0"},
		{"negative shards", with(func(c *Config) { c.Shards = -1 }), "--shards -1"},
		{"shard out of range", with(func(c *Config) { c.Shard = 2; c.Shards = 2 }), "--shard 2"},
		{"negative shard", with(func(c *Config) { c.Shard = -1 }), "--shard -1"},
		{"unknown durability", with(func(c *Config) { c.Durability = "disk" }), `--durability "disk"`},
		{"empty durability", with(func(c *Config) { c.Durability = "" }), `--durability ""`},
		{"zero snapshot interval", with(func(c *Config) { c.SnapshotInterval = 0 }), "--snapshot-interval"},
		{"zero snapshot every", with(func(c *Config) { c.SnapshotEvery = 0 }), "--snapshot-every"},
		{"zero window", with(func(c *Config) { c.Window = 0 }), "--window 0"},
		{"http without port", with(func(c *Config) { c.HTTPAddr = "nohostport" }), "--http"},
		{"token and token file", with(func(c *Config) { c.Token, c.TokenFile = "t", "/run/secrets/t" }), "--token-file"},
		{"provdb token", with(func(c *Config) { c.ProvDBURL, c.ProvDBTokenFile = "http://p:8081", "/run/secrets/t" }), ""},
		{"provdb token and token file", with(func(c *Config) { c.ProvDBURL, c.ProvDBToken, c.ProvDBTokenFile = "http://p:8081", "t", "/t" }), "--provdb-token-file"},
		{"provdb token without url", with(func(c *Config) { c.ProvDBToken = "t" }), "--provdb-token-file is set without --provdb-url"},
		{"provdb url without scheme", with(func(c *Config) { c.ProvDBURL = "localhost:8081" }), "--provdb-url"},
		{"provdb url of another scheme", with(func(c *Config) { c.ProvDBURL = "ftp://p" }), "--provdb-url"},
		{"negative rank series", with(func(c *Config) { c.MaxRankSeries = -1 }), "--max-rank-series"},
		{"relative provdb list path", with(func(c *Config) { c.ProvDBList = "api/v1/records" }), "ProvDBList"},
		{"record path without placeholders", with(func(c *Config) { c.ProvDBRecord = "/api/v1/records/x" }), "ProvDBRecord"},
		{"zero SSE buffer", with(func(c *Config) { c.SSEBuffer = 0 }), "SSEBuffer"},
		{"zero update throttle", with(func(c *Config) { c.UpdateEvery = 0 }), "UpdateEvery"},
		{"zero sync workers", with(func(c *Config) { c.SyncWorkers = 0 }), "SyncWorkers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg
			err := tc.cfg.Validate()
			if tc.cfg != before {
				t.Errorf("Validate changed the config:\n got %+v\nwant %+v", tc.cfg, before)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestNewFillsZeroDefaults: New gives the fields marked "0: default" that
// are zero DefaultConfig's values and leaves the others as given.
func TestNewFillsZeroDefaults(t *testing.T) {
	s, err := New(Config{Run: "a", Shards: 3, Shard: 2, Window: 7}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Shards != 3 || c.Shard != 2 || c.Window != 7 {
		t.Errorf("given fields changed: %+v", c)
	}
	if c.Durability != DurabilityWAL || c.SnapshotInterval != 5*time.Second || c.SnapshotEvery != 20000 ||
		c.MaxRankSeries != 64 || c.SSEBuffer != 16 || c.UpdateEvery != 250*time.Millisecond || c.SyncWorkers != 2 ||
		c.ProvDBList != "/api/v1/records" || c.ProvDBRecord != "/api/v1/records/anomalies/{pid}/{event_id}" {
		t.Errorf("zero fields not filled: %+v", c)
	}
	if c.HTTPAddr != "" || c.NATS != "" || c.ProvDBURL != "" {
		t.Errorf("fields whose zero means something were filled: %+v", c)
	}
	if _, err := New(Config{Run: "a", Shards: 2, Shard: 5}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "--shard 5") {
		t.Errorf("New with shard 5 of 2: %v", err)
	}
}
