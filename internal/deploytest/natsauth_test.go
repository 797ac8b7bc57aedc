package deploytest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// TestNATSConfigsAskWhoConnects starts a NATS server on each shipped
// configuration (compose's deploy/nats/compose.conf and the nats.conf of
// deploy/k8s/nats.yaml), with its users' passwords in the environment as
// the deployments put them, on loopback: a client without credentials is
// refused, a wrong password is refused, and each role's user connects with
// the daemons' --nats-user and --nats-password-file.
func TestNATSConfigsAskWhoConnects(t *testing.T) {
	root := repoRoot(t)
	var k8sConf string
	for _, d := range readYAMLDocs(t, filepath.Join(root, "deploy", "k8s", "nats.yaml")) {
		if strOf(path(d, "kind")) == "ConfigMap" {
			k8sConf = strOf(path(d, "data", "nats.conf"))
		}
	}
	if k8sConf == "" {
		t.Fatal("deploy/k8s/nats.yaml has no nats.conf")
	}
	compose, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "compose.conf"))
	if err != nil {
		t.Fatal(err)
	}
	roles := []string{"ad", "pserver", "provdb", "app"}
	for _, r := range append(roles, "leaf") {
		t.Setenv("NATS_"+strings.ToUpper(r)+"_PASSWORD", "pw-"+r)
	}
	t.Setenv("POD_NAME", "nats-0")
	for _, tc := range []struct{ name, conf string }{{"compose", string(compose)}, {"kubernetes", k8sConf}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "nats.conf")
			if err := os.WriteFile(file, []byte(tc.conf), 0o600); err != nil {
				t.Fatal(err)
			}
			opts, err := server.ProcessConfigFile(file)
			if err != nil {
				t.Fatalf("the server cannot read the configuration: %v", err)
			}
			if len(opts.Users) != len(roles) {
				t.Fatalf("%d users, want one per role %v", len(opts.Users), roles)
			}
			// On loopback, free ports, a temporary store.
			opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, filepath.Join(dir, "js")
			opts.LeafNode.Host, opts.LeafNode.Port = "127.0.0.1", -1
			opts.NoLog, opts.NoSigs = true, true
			s, err := server.NewServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			go s.Start()
			if !s.ReadyForConnections(10 * time.Second) {
				t.Fatal("NATS server not ready")
			}
			defer s.Shutdown()
			connect := func(user, pw string) error {
				var a daemon.NATSAuth
				if user != "" {
					a.User, a.PasswordFile = user, filepath.Join(dir, "pw-file-"+user)
					if err := os.WriteFile(a.PasswordFile, []byte(pw+"\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				o, err := a.Options()
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				nc, err := natsx.Connect(ctx, s.ClientURL(), "deploy-test", append(o, nats.MaxReconnects(0))...)
				if err != nil {
					return err
				}
				nc.Close()
				return nil
			}
			if err := connect("", ""); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("without credentials: %v, want an authorization violation", err)
			}
			if err := connect("ad", "guess"); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("a wrong password: %v, want an authorization violation", err)
			}
			for _, r := range roles {
				if err := connect(r, "pw-"+r); err != nil {
					t.Errorf("user %s: %v", r, err)
				}
			}
		})
	}
}
