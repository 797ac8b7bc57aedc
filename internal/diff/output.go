package diff

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// Title describes what the values of r are, e.g. "mean exclusive TIME per
// thread".
func (r *Result) Title() string {
	switch r.Quantity {
	case Calls:
		return "mean calls per thread"
	case Anomalies:
		return "mean anomalies per 1,000 calls per thread"
	}
	return fmt.Sprintf("mean %s %s per thread", r.Quantity, r.Metric)
}

// Unit is the unit of r's values: "µs" for time metrics, "" otherwise.
func (r *Result) Unit() string {
	if (r.Quantity == Exclusive || r.Quantity == Inclusive) && isTime(r.Metric) {
		return "µs"
	}
	return ""
}

func isTime(metric string) bool { return strings.Contains(strings.ToUpper(metric), "TIME") }

// FormatValue prints a value of r: times (µs) with a unit scaled to their
// size, whole numbers in full, anything else with 6 significant digits.
func (r *Result) FormatValue(v float64) string {
	if r.Unit() != "µs" {
		if v == math.Trunc(v) && math.Abs(v) < 1e15 {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return taudb.FormatG(v, 6)
	}
	return formatMicros(v)
}

// formatMicros prints a time in µs with a unit scaled to its size.
func formatMicros(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return taudb.FormatG(v/1e6, 4) + "s"
	case a >= 1e3:
		return taudb.FormatG(v/1e3, 4) + "ms"
	}
	return taudb.FormatG(v, 4) + "µs"
}

func describeSide(s SideInfo) string {
	d := fmt.Sprintf("%s (%s, %d threads", s.Source, s.Kind, s.Threads)
	if s.Anomalies != nil {
		d += fmt.Sprintf(", %d anomalies", *s.Anomalies)
	}
	return d + ")"
}

// WriteText prints r as a table: a header naming the sides, the quantity,
// the test and the sort rule, then one line per function with A, B, B/A,
// the change of the total, the test's p-value and verdict, and the name;
// rows of two Kipimo runs compared by another quantity start with their
// anomaly counts.
func WriteText(w io.Writer, r *Result) error {
	fmt.Fprintf(w, "A: %s\n", describeSide(r.A))
	fmt.Fprintf(w, "B: %s\n", describeSide(r.B))
	what := "functions"
	if r.CallPaths {
		what = "call paths"
	}
	fmt.Fprintf(w, "%s, over the threads that ran each of the %s\n", capitalize(r.Title()), what)
	total := "total over all threads"
	if r.Quantity == Anomalies {
		total = "anomaly count"
	}
	fmt.Fprintf(w, "Sorted by the change of the %s; a change is beyond the thread-to-thread spread when Welch's t-test on the per-thread values gives p < %s\n",
		total, strconv.FormatFloat(r.Test.Alpha, 'g', -1, 64))
	fmt.Fprintf(w, "Showing %d of %d %s\n", len(r.Functions), r.Count, what)
	if len(r.Functions) == 0 {
		return nil
	}
	// Runs compared by anything but their anomalies also show the
	// anomaly counts.
	anom := r.Quantity != Anomalies && r.Functions[0].AnomaliesA != nil
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	if anom {
		fmt.Fprint(tw, "anomalies A\tanomalies B\t")
	}
	fmt.Fprintln(tw, "A\tB\tB/A\tΔtotal\tp\tchange\t")
	for _, row := range r.Functions {
		ratio := "-"
		if row.Ratio != nil {
			ratio = taudb.FormatG(*row.Ratio, 3)
		}
		p := "-"
		if row.Test != nil {
			p = formatP(row.Test.P)
		}
		delta := row.TotalB - row.TotalA
		d := r.FormatValue(delta)
		if delta > 0 {
			d = "+" + d
		}
		if anom {
			fmt.Fprintf(tw, "%d\t%d\t", *row.AnomaliesA, *row.AnomaliesB)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t  %s\n", r.FormatValue(row.A), r.FormatValue(row.B), ratio, d, p, row.Change, row.Name)
	}
	return tw.Flush()
}

func formatP(p float64) string {
	if p < 1e-4 {
		return "<1e-4"
	}
	return strconv.FormatFloat(p, 'f', 4, 64)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// WriteJSON prints r as one indented JSON document.
func WriteJSON(w io.Writer, r *Result) error {
	out := *r
	if out.Functions == nil {
		out.Functions = []Row{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&out); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}
