// Package deploytest lints the deployment files under deploy/ and the
// documents under docs/. It holds tests only: every YAML file parses (the
// Kubernetes manifests as multi-document streams), the compose file uses only
// images and programs the Dockerfile builds, every --flag, KIPIMO_* variable
// and config-file key used in a deployment file exists in the binary that
// receives it (read from the binary's own --help), secrets never appear on a
// command line, and every relative link in docs/ points at an existing file.
//
// The flag checks build ./cmd/ad, ./cmd/pserver, ./cmd/provdb and
// ./cmd/kipimo with the go command found on PATH; a binary that does not
// build fails the test with the build error.
package deploytest
