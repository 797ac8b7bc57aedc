package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// labelsUsage is the help of --labels on list, count and agg.
const labelsUsage = "anomalies by their label after the end-of-run relabelling: final (or anomaly: those that stand), unflagged (flagged live, not by the final model) or all (or live: every anomaly flagged during the run)"

// parseLabels reads --labels: the words of its help and those the tools
// print (the LABEL column's "anomaly" and "unflagged", the summary's
// "live" and "final").
func parseLabels(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case labelsFinal, provenance.FinalAnomalyLabel, "anomalies", "stand":
		return labelsFinal, nil
	case labelsUnflagged:
		return labelsUnflagged, nil
	case labelsAll, "live":
		return labelsAll, nil
	}
	return "", fmt.Errorf("--labels %q: use final (or anomaly), unflagged, or all (or live)", s)
}

// keeps reports whether an anomaly relabelled against the final models
// (relabel) is one that labels selects.
func keeps(e *provenance.Exec, labels string) bool {
	switch labels {
	case labelsFinal:
		return e.FinalLabel != provenance.FinalUnflagged
	case labelsUnflagged:
		return e.FinalLabel == provenance.FinalUnflagged
	}
	return true
}

// labelRanges is what count and agg read when --labels selects among
// anomalies: the final models' ranges, nil when every record is read as
// stored (another kind, --labels all, or a run without final natural
// ranges: Chimbuko's rules, or a run still going).
func labelRanges(cmd *cobra.Command, b queryBackend, kind provenance.Kind, raw string) (labels string, ranges map[string]provenance.Range, err error) {
	if labels, err = parseLabels(raw); err != nil {
		return "", nil, err
	}
	if kind != provenance.KindAnomalies {
		if cmd.Flags().Changed("labels") {
			return "", nil, fmt.Errorf("--labels applies to --kind anomalies, not %s", kind)
		}
		return labels, nil, nil
	}
	if labels == labelsAll {
		return labels, nil, nil
	}
	ranges, err = finalRanges(cmd.Context(), b)
	if err != nil || len(ranges) > 0 {
		return labels, ranges, err
	}
	if labels == labelsUnflagged {
		// Nothing was relabelled: no anomaly is unflagged.
		return labels, map[string]provenance.Range{}, nil
	}
	return labels, nil, nil
}

// eachLabelled streams the anomalies q selects (every one: q's limit is not
// applied) that labels keeps, relabelled against ranges.
func eachLabelled(ctx context.Context, b queryBackend, q provenance.Query, labels string, ranges map[string]provenance.Range, fn func(*provenance.Exec)) error {
	if len(ranges) == 0 {
		// --labels unflagged on a run that relabelled nothing.
		return nil
	}
	q.Limit = provenance.NoLimit
	q.Sort, q.Desc = provenance.SortEntry, false
	return b.Each(ctx, q, func(e provenance.Exec) error {
		relabel(&e, q.Kind, ranges)
		if keeps(&e, labels) {
			fn(&e)
		}
		return nil
	})
}

// countLabelled counts the anomalies q selects that labels keeps.
func countLabelled(ctx context.Context, b queryBackend, q provenance.Query, labels string, ranges map[string]provenance.Range) (int64, error) {
	var n int64
	err := eachLabelled(ctx, b, q, labels, ranges, func(*provenance.Exec) { n++ })
	return n, err
}

// aggregateLabelled groups the anomalies q selects that labels keeps as
// Store.Aggregate groups them: largest count first, at most q.Limit groups.
func aggregateLabelled(ctx context.Context, b queryBackend, q provenance.Query, by provenance.GroupBy, labels string, ranges map[string]provenance.Range) ([]provenance.Group, error) {
	type key struct {
		rank uint32
		fn   string
		step uint64
	}
	counts := map[key]int64{}
	err := eachLabelled(ctx, b, q, labels, ranges, func(e *provenance.Exec) {
		var k key
		switch by {
		case provenance.ByRank:
			k.rank = e.RID
		case provenance.ByFunc:
			k.fn = e.Func
		case provenance.ByStep:
			k.step = e.IOStep
		case provenance.ByRankFunc:
			k.rank, k.fn = e.RID, e.Func
		}
		counts[k]++
	})
	if err != nil {
		return nil, err
	}
	gs := make([]provenance.Group, 0, len(counts))
	for k, n := range counts {
		gs = append(gs, provenance.MakeGroup(by, k.rank, k.fn, k.step, n))
	}
	return provenance.SortGroups(gs, max(q.Limit, 0)), nil
}
