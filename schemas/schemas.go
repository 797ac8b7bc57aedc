// Package schemas embeds the specifications kept in this directory, so that
// code and tests read the one copy: the TAUdb schema the taudb package
// creates, and the JSON Schemas of frames, parameter-server sync messages
// and provenance records.
package schemas

import "embed"

// TAUdbSQL is the TAUdb schema (version 2) for PostgreSQL, taudb.sql.
//
//go:embed taudb.sql
var TAUdbSQL string

// FrameJSON is the JSON Schema of a frame in its JSON form,
// frame.schema.json.
//
//go:embed frame.schema.json
var FrameJSON []byte

// SyncJSON is the JSON Schema of the parameter server's sync request and
// reply, sync.schema.json.
//
//go:embed sync.schema.json
var SyncJSON []byte

// Provenance holds the JSON Schema of each provenance kind's records,
// provenance/<kind>.schema.json.
//
//go:embed provenance/*.schema.json
var Provenance embed.FS
