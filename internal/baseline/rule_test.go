package baseline

import (
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// A reference read with one natural-range rule and then with another is
// the reference read with the other from the start; with its own rule, or
// from a TAU profile, it is itself.
func TestWithRule(t *testing.T) {
	// 2,000 runtimes of 3-12 µs and 8 at 40-47 µs: a mode a rule that needs
	// 5 values per bin to call it natural leaves out, one that needs 1 takes
	// in.
	h := hist(append(repeat(200, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 40, 41, 42, 43, 44, 45, 46, 47)...)
	fs := []provenance.GlobalFuncStats{{Func: "f", Stats: provenance.FuncStats{Count: 2008, Accumulate: 16000}, NaturalHist: h}}
	loose := rule
	loose.Recur, loose.RecurFrac = 1, 0
	strict, err := FromFuncStats("clean", fs, rule)
	if err != nil {
		t.Fatal(err)
	}
	want, err := FromFuncStats("clean", fs, loose)
	if err != nil {
		t.Fatal(err)
	}
	if bare(strict.Keys["f"]) == bare(want.Keys["f"]) {
		t.Fatalf("the two rules read the same bound %v: the test needs them to differ", want.Keys["f"].Bound)
	}
	got := strict.WithRule(loose)
	if bare(got.Keys["f"]) != bare(want.Keys["f"]) || got.Keys["f"].Hist != strict.Keys["f"].Hist || got.Rule != loose || got.IOSteps != want.IOSteps || got.Source != "clean" {
		t.Errorf("read again with the loose rule: %+v, want %+v (sharing the histogram)", bare(got.Keys["f"]), bare(want.Keys["f"]))
	}
	if k := strict.Keys["f"]; k.Bound >= 40 {
		t.Errorf("the original's bound %v changed: WithRule must copy", k.Bound)
	}
	if strict.WithRule(rule) != strict {
		t.Error("read again with its own rule: want the reference itself")
	}
	tau := &Reference{Source: "p", Kind: KindTAU, Keys: map[string]*Key{"f": {Name: "f", Calls: 3, TotalUs: 9}}}
	if tau.WithRule(loose) != tau {
		t.Error("a TAU reference has no bounds to read: want it itself")
	}
}

// bare is k without its histogram, to compare what was read from it.
func bare(k *Key) Key {
	c := *k
	c.Hist = nil
	return c
}
