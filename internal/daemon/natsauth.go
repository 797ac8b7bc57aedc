package daemon

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// NATSAuth is how a component proves who it is to a NATS server that asks,
// and how it checks the server: at most one of a credentials file (JWT and
// nkey seed, as nsc writes it), an nkey seed file, or a user and password
// file; and for TLS a CA file and a client certificate with its key. Files
// that hold secrets (credentials, seed, password, key) must not be readable
// by every user (see CheckPrivate). A token goes in the NATS URL
// (nats://TOKEN@host:4222), which is never logged.
type NATSAuth struct {
	Creds        string // --nats-creds
	NKey         string // --nats-nkey
	User         string // --nats-user
	PasswordFile string // --nats-password-file
	CA           string // --nats-ca
	Cert         string // --nats-cert
	Key          string // --nats-key
}

// AddNATSAuthFlags adds the --nats-* authentication and TLS flags to fs
// and returns where their values land once fs is parsed.
func AddNATSAuthFlags(fs *pflag.FlagSet) *NATSAuth {
	a := &NATSAuth{}
	fs.StringVar(&a.Creds, "nats-creds", "", "NATS credentials file (a user JWT and its nkey seed, as nsc writes it)")
	fs.StringVar(&a.NKey, "nats-nkey", "", "file holding the NATS user's nkey seed")
	fs.StringVar(&a.User, "nats-user", "", "NATS user name (with --nats-password-file)")
	fs.StringVar(&a.PasswordFile, "nats-password-file", "", "file holding the NATS user's password")
	fs.StringVar(&a.CA, "nats-ca", "", "PEM file of the CA that signed the NATS server's certificate (TLS)")
	fs.StringVar(&a.Cert, "nats-cert", "", "PEM client certificate for NATS servers that verify clients (TLS, with --nats-key)")
	fs.StringVar(&a.Key, "nats-key", "", "PEM private key of --nats-cert")
	return a
}

// Options checks the settings and returns the connection options that
// apply them (none when nothing is set). Errors name the flag and say what
// to do.
func (a NATSAuth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	var errs []error
	n := 0
	for _, v := range []string{a.Creds, a.NKey, a.User} {
		if v != "" {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("--nats-creds, --nats-nkey and --nats-user are alternatives: give one"))
	}
	private := func(flag, path string) bool {
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", flag, err))
			return false
		}
		if err := CheckPrivate(path); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", flag, err))
			return false
		}
		return true
	}
	if a.Creds != "" && private("nats-creds", a.Creds) {
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.NKey != "" && private("nats-nkey", a.NKey) {
		o, err := nats.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			errs = append(errs, fmt.Errorf("--nats-nkey %s: %w", a.NKey, err))
		} else {
			opts = append(opts, o)
		}
	}
	switch {
	case a.User != "" && a.PasswordFile == "":
		errs = append(errs, errors.New("--nats-user needs --nats-password-file"))
	case a.User == "" && a.PasswordFile != "":
		errs = append(errs, errors.New("--nats-password-file needs --nats-user"))
	case a.User != "":
		pw, err := Secret("nats-password-file", a.PasswordFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			opts = append(opts, nats.UserInfo(a.User, pw))
		}
	}
	if a.CA != "" {
		if _, err := os.Stat(a.CA); err != nil {
			errs = append(errs, fmt.Errorf("--nats-ca: %w", err))
		} else {
			opts = append(opts, nats.RootCAs(a.CA))
		}
	}
	switch {
	case (a.Cert == "") != (a.Key == ""):
		errs = append(errs, errors.New("--nats-cert and --nats-key go together"))
	case a.Cert != "":
		if _, err := os.Stat(a.Cert); err != nil {
			errs = append(errs, fmt.Errorf("--nats-cert: %w", err))
		} else if private("nats-key", a.Key) {
			opts = append(opts, nats.ClientCert(a.Cert, a.Key))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return opts, nil
}
