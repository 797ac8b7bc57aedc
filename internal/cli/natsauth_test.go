package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

// startUserServer starts a loopback NATS server with JetStream that admits
// user kipimo with password pw only.
func startUserServer(t *testing.T, pw string) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		Username: "kipimo", Password: pw,
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

// Commands that connect to a NATS server take the daemons' --nats-user and
// --nats-password-file: without them a server that asks for a user refuses
// the command with an error that says which flags to give; with them the
// command works; a wrong password is refused as such.
func TestCLINATSUserPassword(t *testing.T) {
	url := startUserServer(t, "s3cret")
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte("guess\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	frames := t.TempDir()
	if _, _, err := runCLI(t, "gen", "--ranks", "2", "--steps", "3", "--out", frames); err != nil {
		t.Fatal(err)
	}
	creds := []string{"--nats-user", "kipimo", "--nats-password-file", pw}
	bad := []string{"--nats-user", "kipimo", "--nats-password-file", wrong}
	cases := []struct {
		name string
		args []string
		want string // in the error; "" for success
	}{
		{"replay without credentials", []string{"replay", "--nats", url, "--run", "r1", frames}, "give --nats-user with --nats-password-file"},
		{"replay with a wrong password", append([]string{"replay", "--nats", url, "--run", "r1", frames}, bad...), "refused the credentials given"},
		{"replay with credentials", append([]string{"replay", "--nats", url, "--run", "r1", frames}, creds...), ""},
		{"run without credentials", []string{"run", "--nats", url, "--run", "a1", "--out", t.TempDir(), "--ranks", "2", "--steps", "3"}, "give --nats-user with --nats-password-file"},
		{"run with credentials", append([]string{"run", "--nats", url, "--run", "a2", "--out", t.TempDir(), "--ranks", "2", "--steps", "3"}, creds...), ""},
		{"callstack without credentials", []string{"callstack", "--nats", url, "--run", "a2", "--timeout", "200ms", "--quiet", "100ms"}, "give --nats-user with --nats-password-file"},
		{"credentials without --nats", append([]string{"run", "--out", t.TempDir(), "--ranks", "2", "--steps", "3"}, creds...), "the embedded NATS server asks for none"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runCLI(t, tc.args...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("kipimo %s: %v", strings.Join(tc.args, " "), err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("kipimo %s: error %v, want one saying %q", strings.Join(tc.args, " "), err, tc.want)
			}
		})
	}
}

// The event library reads a user and password from its URL only: exec puts
// --nats-user and --nats-password-file there, unescaped, and refuses what
// the library cannot use with what to do instead.
func TestLibraryNATSURL(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pw := file("pw", "pa:ss!word\n")
	odd := file("odd", "a@b\n")
	seed := file("seed", "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4\n")
	cases := []struct {
		name, url string
		auth      daemon.NATSAuth
		want      string // the URL, or what the error says
		fails     bool
	}{
		{"nothing to add", "nats://10.0.0.5:4222", daemon.NATSAuth{}, "nats://10.0.0.5:4222", false},
		{"a token stays in the URL", "nats://tok@10.0.0.5:4222", daemon.NATSAuth{}, "nats://tok@10.0.0.5:4222", false},
		{"user and password", "nats://10.0.0.5:4222", daemon.NATSAuth{User: "ad", PasswordFile: pw}, "nats://ad:pa:ss!word@10.0.0.5:4222", false},
		{"the first server of a list", "nats://h1:4222,nats://h2:4222", daemon.NATSAuth{User: "ad", PasswordFile: pw}, "nats://ad:pa:ss!word@h1:4222", false},
		{"a password the library cannot read", "nats://h1:4222", daemon.NATSAuth{User: "ad", PasswordFile: odd}, "may hold only", true},
		{"credentials twice", "nats://u:p@h1:4222", daemon.NATSAuth{User: "ad", PasswordFile: pw}, "already holds credentials", true},
		{"an nkey", "nats://h1:4222", daemon.NATSAuth{NKey: seed}, "--nats-nkey: the event library", true},
		{"a user without a password", "nats://h1:4222", daemon.NATSAuth{User: "ad"}, "--nats-user needs --nats-password-file", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := libraryNATSURL(tc.url, &tc.auth)
			if tc.fails {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %q, %v; want an error saying %q", got, err, tc.want)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
