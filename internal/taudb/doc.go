// Package taudb is a Go counterpart of TAU's TAUdb C API: the trial tree
// (trial, thread, metric, time_range, timer with groups and parameters,
// timer_callpath, timer_call_data, timer_value, counter, counter_value,
// primary and secondary metadata) with lookups by id and by name; profiles
// made into trials: TAU profile directories, ParaProf ppk and TAU XML
// (ReadDir, ReadPPK, ReadSnapshotXML, ReadSnapshotDir) are decoded by
// internal/format/tauprofile, ppk and tauxml into profile files, which one
// merge, BuildTrial, makes into a trial; Caliper region profiles
// (ReadCaliper on internal/format/cali, ReadCaliperJSON) go through the same
// merge; trials written as TAU profile files (profile.N.C.T, MULTI__<metric>
// directories) the way TAU writes them; the derived threads -1..-7 computed
// the way TAU's Java loader computes them; and a PostgreSQL store (pgx/v5) in
// the tables and columns of TAUdb schema version 2 (SchemaSQL, the same text
// as schemas/taudb.sql), so that ParaProf and PerfExplorer read what is
// stored here as if TAU's own loader had written it. For TAU's fixtures the
// stored rows are the rows TAU's loader stores (testdata/taudb-ref).
//
// A Trial is a plain value tree owned by its creator. It is not safe for
// concurrent mutation; concurrent reads are fine once it is built. A Store
// is safe for concurrent use.
//
// # Writing profiles
//
// ReadDir keeps what a profile file holds beyond the TAUdb data (TAU's blanks
// in names, the GROUP text, the line-1 header, line 2's metadata in order,
// each thread's line order), so WriteDir reproduces TAU's files byte for byte;
// numbers are printed by FormatG16, a Go equivalent of C's %.16G. Where the
// output is canonical rather than a copy of the input:
//   - a trial loaded from TAUdb (or built in Go) has no file spelling: names are
//     TAUdb's normalized ones (runs of spaces collapsed, trimmed), groups are
//     joined with "|", call-path lines get "TAU_CALLPATH|<leaf groups>", and a
//     thread's metadata is the trial-level rows plus its own, sorted by name
//     (as TAU writes it), after "Metric Name";
//   - duplicate names in one file are summed (user events combined) as TAU's
//     reader does, so they come out as one line;
//   - negative times are read as 0 (TAU's reader does the same);
//   - lines with TAU_CALLPATH_DERIVED groups (made by ParaProf) are dropped;
//   - a SumExclSqr column is read but not written; aggregates are written as
//     "0 aggregates" (TAU never writes others); lines without GROUP= get
//     GROUP="";
//   - a carriage return in metadata is written as "&#xd;" (TAU would write it
//     raw and XML readers would turn it into a newline).
//
// # Storing
//
// SaveTrial follows TAU's loader: flat timers only in timer (short name and
// source location from "[{file} {l,c}-{l,c}]", parameters from
// "[ <p> = <v> ]"), a root timer_callpath row per timer and a child per call
// path, call data and values only where calls > 0, the derived threads as
// thread rows -1..-7, counter values for real threads with the sum of
// squares in standard_deviation, values below 1e-307 as 0 and above 1e308 as
// 9e307, calls truncated to int. Context metadata (<timer_context>) is kept
// in the files but not stored, as TAU's loader cannot store it either.
// Derived counter values are computed (ComputeDerived) but, like TAU, not
// stored; LoadTrial recomputes them.
package taudb
