package cli

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

// addNATSAuth adds the daemons' --nats-* authentication and TLS flags
// (daemon.AddNATSAuthFlags) to a command that connects to a NATS server.
func addNATSAuth(fs *pflag.FlagSet) *daemon.NATSAuth { return daemon.AddNATSAuthFlags(fs) }

// natsAuthHint adds what to do to a connection error the server gave
// because it asks for credentials the command did not give, or refused
// the ones given.
func natsAuthHint(err error, a *daemon.NATSAuth) error {
	if err == nil {
		return nil
	}
	auth := errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked)
	if !auth {
		return err
	}
	if a.Creds == "" && a.NKey == "" && a.User == "" {
		return fmt.Errorf("%w: the NATS server asks who is connecting: give --nats-user with --nats-password-file, --nats-creds or --nats-nkey (or a token in the URL, nats://TOKEN@host:4222)", err)
	}
	return fmt.Errorf("%w: the NATS server refused the credentials given: check the user and password file, credentials file or nkey seed against the server's configuration", err)
}

// libraryNATSURL is the KIPIMO_NATS URL of the event library preloaded into
// a program, from the server URL raw and the --nats-* flags a. The library
// speaks plain NATS and reads a user and password or a token from its URL
// only, so --nats-user and --nats-password-file go into each server's URL
// (nats://USER:PASSWORD@host:4222; the library connects to the first server
// of a list only) and credentials files, nkeys and TLS are refused with what
// to do instead.
func libraryNATSURL(raw string, a *daemon.NATSAuth) (string, error) {
	if _, err := a.Options(); err != nil {
		return "", err
	}
	for _, f := range []struct{ flag, v string }{{"nats-creds", a.Creds}, {"nats-nkey", a.NKey}, {"nats-ca", a.CA}, {"nats-cert", a.Cert}} {
		if f.v != "" {
			return "", fmt.Errorf("--%s: the event library inside the program speaks plain NATS with a user and password or a token, without credentials files, nkeys or TLS: give --nats-user and --nats-password-file (or nats://TOKEN@host in --nats), or point --nats at a node-local server or leaf node that accepts them", f.flag)
		}
	}
	if a.User == "" {
		return raw, nil
	}
	pw, err := daemon.Secret("nats-password-file", a.PasswordFile)
	if err != nil {
		return "", err
	}
	ok := func(s string, colon bool) bool {
		for _, r := range s {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~!$&'()*+;=", r) || colon && r == ':') {
				return false
			}
		}
		return true
	}
	if !ok(a.User, false) || !ok(pw, true) {
		return "", errors.New("--nats-user and --nats-password-file: the event library reads them from its URL as they are, so they may hold only letters, digits and - . _ ~ ! $ & ' ( ) * + ; = (the password also :)")
	}
	// The library connects to the first server of a list only.
	first, _, _ := strings.Cut(raw, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("--nats %q is not a nats://host:port URL", first)
	}
	if u.User != nil {
		return "", fmt.Errorf("--nats %s already holds credentials: give them in the URL or with --nats-user, not both", u.Redacted())
	}
	// Written as it is: the library does not unescape %XX.
	return u.Scheme + "://" + a.User + ":" + pw + "@" + u.Host, nil
}
