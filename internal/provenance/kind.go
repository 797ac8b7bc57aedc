package provenance

import (
	"strings"
)

// Kind names one collection of provenance records. Its string is the
// collection's (or table's) name in every store and the last token of the
// record's NATS subject, kipimo.<run>.prov.<kind>.
type Kind string

// The provenance kinds, with Chimbuko's collection names.
const (
	KindAnomalies    Kind = "anomalies"     // anomalous executions
	KindNormalExecs  Kind = "normalexecs"   // sampled normal executions
	KindMetadata     Kind = "metadata"      // run metadata, per (pid, rid, tid)
	KindFuncStats    Kind = "func_stats"    // global function statistics
	KindCounterStats Kind = "counter_stats" // global counter statistics
	KindProfiles     Kind = "profiles"      // per-thread profiles
)

// Kinds lists every provenance kind.
var Kinds = []Kind{KindAnomalies, KindNormalExecs, KindMetadata, KindFuncStats, KindCounterStats, KindProfiles}

// String is the kind's collection name.
func (k Kind) String() string { return string(k) }

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// IsExec reports whether k holds executions (anomalies, normalexecs).
func (k Kind) IsExec() bool { return k == KindAnomalies || k == KindNormalExecs }

// KindNames lists the kinds' names separated by commas, for messages.
func KindNames() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// ValidKind reports whether kind is one of Kinds.
func ValidKind(kind Kind) bool { return kind.Valid() }

// IsExecKind reports whether kind holds executions (anomalies, normalexecs).
func IsExecKind(kind Kind) bool { return kind.IsExec() }
