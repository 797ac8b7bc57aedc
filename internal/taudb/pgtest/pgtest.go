// Package pgtest gives tests a throwaway PostgreSQL database: a server
// started from the installed PostgreSQL binaries (/usr/lib/postgresql/*/bin)
// on 127.0.0.1 and a random port, or the server named by KIPIMO_TEST_PG_DSN.
// Each NewDatabase call creates a fresh database, dropped when the test ends.
// Without PostgreSQL the tests skip with a clear message, unless
// KIPIMO_REQUIRE_PG=1, when they fail.
//
// A package using NewDatabase calls Main from its TestMain, which stops the
// shared server (and removes its files) after the package's tests; Isolated
// gives a test a server of its own instead, stopped when the test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	mu      sync.Mutex
	srv     *server
	srvErr  error
	started bool
)

type server struct {
	dir   string
	bin   string
	dsn   string // admin DSN (database postgres)
	owned bool   // started here; stop on Main's exit
}

// Main runs the package's tests and then stops the server this package
// started, if any. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the shared server if it was started by this process.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if srv != nil && srv.owned {
		srv.stop()
	}
	srv, started = nil, false
}

func unavailable(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("PostgreSQL is not available (%v); install it (apt-get install -y postgresql) or set KIPIMO_TEST_PG_DSN", err)
	if os.Getenv("KIPIMO_REQUIRE_PG") == "1" {
		t.Fatalf("KIPIMO_REQUIRE_PG=1: %s", msg)
		return
	}
	t.Skip("SKIPPING: " + msg)
}

// NewDatabase returns the DSN of a new, empty database; it is dropped when
// t ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	mu.Lock()
	if !started {
		started = true
		srv, srvErr = start()
	}
	s, err := srv, srvErr
	mu.Unlock()
	if err != nil {
		unavailable(t, err)
	}
	return createDatabase(t, s)
}

// Isolated is NewDatabase on a server of the test's own, stopped when t
// ends; for packages that do not call Main from their TestMain.
func Isolated(t testing.TB) string {
	t.Helper()
	s, err := start()
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if s.owned {
			s.stop()
		}
	})
	return createDatabase(t, s)
}

func createDatabase(t testing.TB, s *server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		unavailable(t, fmt.Errorf("connect: %w", err))
	}
	defer conn.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kipimo_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, s.dsn)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(s.dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func start() (*server, error) {
	if dsn := os.Getenv("KIPIMO_TEST_PG_DSN"); dsn != "" {
		return &server{dsn: dsn}, nil
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, errors.New("no /usr/lib/postgresql/*/bin/initdb")
	}
	sort.Slice(bins, func(i, j int) bool { return pgMajor(bins[i]) > pgMajor(bins[j]) })
	s := &server{bin: filepath.Dir(bins[0]), owned: true}
	dir, err := os.MkdirTemp("", "kipimo-pgtest-")
	if err != nil {
		return nil, err
	}
	s.dir = dir
	asRoot := os.Geteuid() == 0
	if asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run(asRoot, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off", port, dir)
	if out, err := s.run(asRoot, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %v: %s %s", err, out, log)
	}
	s.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s, nil
}

func (s *server) run(asRoot bool, prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	var cmd *exec.Cmd
	if asRoot {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	return cmd.CombinedOutput()
}

func (s *server) stop() {
	if s.dir == "" {
		return
	}
	_, _ = s.run(os.Geteuid() == 0, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(s.dir)
}

func pgMajor(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
