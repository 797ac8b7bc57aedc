package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// runAuthServer starts a loopback NATS server with opts' authentication.
func runAuthServer(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(s.Shutdown)
	if opts.TLSConfig != nil {
		return "tls://" + s.Addr().String()
	}
	return s.ClientURL()
}

func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// connect connects to url with a's options.
func connect(a NATSAuth, url string) error {
	opts, err := a.Options()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := natsx.Connect(ctx, url, "auth-test", opts...)
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}

// Each way of proving who a component is reaches a real server that asks
// for it; a wrong secret is refused by the server, and a secret file every
// user can read is refused before connecting.
func TestNATSAuth(t *testing.T) {
	dir := t.TempDir()
	pwURL := runAuthServer(t, &server.Options{Username: "kipimo", Password: "s3cret"})
	seed, pub := newNKey(t)
	nkURL := runAuthServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	tlsURL, ca, cert, key := tlsServer(t, dir)
	for _, tc := range []struct {
		name    string
		a       NATSAuth
		url     string
		wantErr string
	}{
		{"user and password", NATSAuth{User: "kipimo", PasswordFile: writeFile(t, dir, "pw", "s3cret\n", 0o600)}, pwURL, ""},
		{"wrong password", NATSAuth{User: "kipimo", PasswordFile: writeFile(t, dir, "bad", "nope\n", 0o600)}, pwURL, "uthorization"},
		{"no credentials", NATSAuth{}, pwURL, "uthorization"},
		{"password file readable by all", NATSAuth{User: "kipimo", PasswordFile: writeFile(t, dir, "open", "s3cret\n", 0o644)}, pwURL, "chmod 600"},
		{"user without password", NATSAuth{User: "kipimo"}, pwURL, "--nats-password-file"},
		{"nkey seed", NATSAuth{NKey: writeFile(t, dir, "seed", seed, 0o600)}, nkURL, ""},
		{"two alternatives", NATSAuth{NKey: writeFile(t, dir, "seed2", seed, 0o600), User: "x", PasswordFile: writeFile(t, dir, "pw2", "x", 0o600)}, nkURL, "alternatives"},
		{"TLS with a client certificate", NATSAuth{CA: ca, Cert: cert, Key: key}, tlsURL, ""},
		{"TLS without the client certificate", NATSAuth{CA: ca}, tlsURL, "connect to NATS"},
		{"certificate without its key", NATSAuth{CA: ca, Cert: cert}, tlsURL, "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := connect(tc.a, tc.url)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("connect: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func newNKey(t *testing.T) (seed, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return string(s), p
}

// tlsServer starts a NATS server that verifies client certificates, and
// writes a CA, and a client certificate and key it signed, into dir.
func tlsServer(t *testing.T, dir string) (url, caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kipimo test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (certPEM, keyPEM []byte) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage},
			KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	srvCert, srvKey := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	cliCert, cliKey := issue(3, "kipimo-ad", x509.ExtKeyUsageClientAuth, nil)
	caFile = writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), 0o644)
	certFile = writeFile(t, dir, "client.pem", string(cliCert), 0o644)
	keyFile = writeFile(t, dir, "client-key.pem", string(cliKey), 0o600)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	url = runAuthServer(t, &server.Options{TLSConfig: cfg, TLS: true, TLSVerify: true, TLSTimeout: 5})
	return url, caFile, certFile, keyFile
}
