package taudb

import (
	"context"
	"math"
	"testing"
)

func approxEqual(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b))
}

// TestSeedViewsMatchDerivedThreads stores the hatchet cpi-mpi trial and reads
// it through the schema's compatibility views: interval_mean_summary and
// interval_total_summary must hold the derived threads computed in Go, the
// same statistics computed by SQL over interval_location_profile must agree
// with them, and atomic_location_profile must give Go's counter statistics.
func TestSeedViewsMatchDerivedThreads(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	tr := readFixture(t, "hatchet-tau-cpi-mpi")
	if _, err := s.SaveTrial(ctx, tr); err != nil {
		t.Fatal(err)
	}
	time := tr.Metric("TIME")
	byID := map[int]*TimerCallpath{}
	for _, c := range tr.Callpaths {
		byID[c.ID] = c
	}
	for _, view := range []struct {
		name string
		idx  int
	}{{"interval_mean_summary", MeanWithoutNulls}, {"interval_total_summary", Total}} {
		rows, err := s.pool.Query(ctx, `SELECT v.interval_event, v.inclusive, v.exclusive, v.inclusive_percentage, v.exclusive_percentage, v.call, v.subroutines
			FROM `+view.name+` v JOIN timer_callpath c ON c.id = v.interval_event JOIN timer t ON t.id = c.timer
			WHERE t.trial = $1 AND v.metric = $2`, tr.ID, time.ID)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var id, calls, subrs int
			var incl, excl, ip, ep float64
			if err := rows.Scan(&id, &incl, &excl, &ip, &ep, &calls, &subrs); err != nil {
				t.Fatal(err)
			}
			n++
			d := tr.Thread(view.idx).CallDataFor(byID[id])
			v := d.Value(time)
			if incl != v.Inclusive || excl != v.Exclusive || ip != v.InclusivePercent || ep != v.ExclusivePercent || float64(calls) != d.Calls || float64(subrs) != d.Subroutines {
				t.Errorf("%s %q: view (%v %v %v %v %d %d), Go (%v %v %v %v %v %v)", view.name, byID[id].Name,
					incl, excl, ip, ep, calls, subrs, v.Inclusive, v.Exclusive, v.InclusivePercent, v.ExclusivePercent, d.Calls, d.Subroutines)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != len(tr.Callpaths) {
			t.Errorf("%s: %d rows, want one per call path (%d)", view.name, n, len(tr.Callpaths))
		}
	}

	// SQL's own statistics over the per-thread view.
	rows, err := s.pool.Query(ctx, `SELECT v.interval_event, avg(v.inclusive), sum(v.exclusive), min(v.inclusive), max(v.exclusive), stddev_pop(v.inclusive)
		FROM interval_location_profile v JOIN timer_callpath c ON c.id = v.interval_event JOIN timer t ON t.id = c.timer
		WHERE t.trial = $1 AND v.metric = $2 GROUP BY v.interval_event`, tr.ID, time.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		var mean, total, mn, mx, sd float64
		if err := rows.Scan(&id, &mean, &total, &mn, &mx, &sd); err != nil {
			t.Fatal(err)
		}
		c := byID[id]
		get := func(idx int) *TimerValue { return tr.Thread(idx).CallDataFor(c).Value(time) }
		if !approxEqual(mean, get(MeanWithoutNulls).Inclusive) || !approxEqual(total, get(Total).Exclusive) || mn != get(Min).Inclusive || mx != get(Max).Exclusive {
			t.Errorf("%q: SQL mean/total/min/max %v %v %v %v, Go %v %v %v %v", c.Name, mean, total, mn, mx,
				get(MeanWithoutNulls).Inclusive, get(Total).Exclusive, get(Min).Inclusive, get(Max).Exclusive)
		}
		var goSD float64
		if d := tr.Thread(StddevWithoutNulls).CallDataFor(c); d != nil {
			goSD = d.Value(time).Inclusive
		} else {
			// TAU stores no STDDEV row where call counts agree; compute it.
			var a acc
			for _, th := range tr.RealThreads() {
				if d := th.CallDataFor(c); d != nil {
					a.add(d.Value(time).Inclusive)
				}
			}
			goSD = a.stddev()
		}
		if math.Abs(sd-goSD) > 1e-6*math.Max(1, goSD) {
			t.Errorf("%q: SQL stddev_pop %v, Go %v", c.Name, sd, goSD)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	crow, err := s.pool.Query(ctx, `SELECT e.name, avg(v.mean_value), sum(v.sample_count), min(v.minimum_value), max(v.maximum_value), sum(v.standard_deviation)
		FROM atomic_location_profile v JOIN atomic_event e ON e.id = v.atomic_event WHERE e.trial = $1 GROUP BY e.name`, tr.ID)
	if err != nil {
		t.Fatal(err)
	}
	nc := 0
	for crow.Next() {
		var name string
		var mean, mn, mx, sumsq float64
		var count int
		if err := crow.Scan(&name, &mean, &count, &mn, &mx, &sumsq); err != nil {
			t.Fatal(err)
		}
		nc++
		c := tr.Counter(name)
		m, tot := tr.Thread(MeanWithoutNulls).CounterValueFor(c), tr.Thread(Total).CounterValueFor(c)
		lo, hi := tr.Thread(Min).CounterValueFor(c), tr.Thread(Max).CounterValueFor(c)
		if !approxEqual(mean, m.Mean) || float64(count) != tot.SampleCount || mn != lo.Minimum || mx != hi.Maximum || !approxEqual(sumsq, tot.SumSquares) {
			t.Errorf("counter %q: SQL %v %d %v %v %v, Go %v %v %v %v %v", name, mean, count, mn, mx, sumsq, m.Mean, tot.SampleCount, lo.Minimum, hi.Maximum, tot.SumSquares)
		}
	}
	if err := crow.Err(); err != nil {
		t.Fatal(err)
	}
	if nc != len(tr.Counters) {
		t.Errorf("atomic_location_profile: %d counters, want %d", nc, len(tr.Counters))
	}
}
