package taudb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseDetails(t *testing.T) {
	tr := readFixture(t, "tau2-examples-wrap")
	main := tr.Timer("int main(int, char **) C [{main.c} {5,1}-{17,1}]")
	if main == nil {
		t.Fatal("main timer not found by normalized name")
	}
	if main.ShortName != "int main(int, char **) C" || main.SourceFile != "main.c" || main.LineNumber != 5 || main.LineNumberEnd != 17 || main.ColumnNumber != 1 || main.ColumnNumberEnd != 1 {
		t.Errorf("main source link = %+v", main)
	}
	p := tr.Timer("int __wrap_dgemm(int) C [{wb.c} {5,1}-{11,1}] [ <size> = <10000> ]")
	if p == nil || len(p.Parameters) != 1 || p.Parameters[0] != (Parameter{"size", "10000"}) {
		t.Fatalf("parameter timer = %+v", p)
	}
	if got := strings.Join(p.Groups, ","); got != "TAU_PARAM,TAU_USER" {
		t.Errorf("parameter timer groups = %q", got)
	}
	th := tr.Thread(1)
	if th == nil || th.NodeRank != 1 {
		t.Fatalf("thread index 1 = %+v", th)
	}
	d := th.CallDataFor(main.Root())
	if d == nil || d.Calls != 1 || d.Subroutines != 6 || d.Value(tr.Metric("TIME")).Inclusive != 1048975 {
		t.Errorf("main on rank 1 = %+v", d)
	}
	if v, ok := tr.Primary("TAU Config"); !ok || !strings.HasPrefix(v, "-PROFILEPARAM") {
		t.Errorf("primary TAU Config = %q, %v; want the trimmed value", v, ok)
	}

	cp := readFixture(t, "hatchet-tau-cpi-mpi")
	leaf := cp.Callpath(".TAU application => MPI_Finalize() => MPI_Info_create()")
	if leaf == nil || leaf.Parent != cp.Callpath(".TAU application => MPI_Finalize()") || leaf.Timer != cp.Timer("MPI_Info_create()") || leaf.Depth() != 2 {
		t.Fatalf("call path = %+v", leaf)
	}
	if c := cp.Counter("Message size for reduce"); c == nil || cp.Thread(3).CounterValueFor(c).SumSquares != 64 {
		t.Errorf("counter lookup failed: %+v", c)
	}
	mean := cp.Thread(MeanWithoutNulls).CallDataFor(cp.Timer(".TAU application").Root())
	if mean == nil || mean.Value(cp.Metric("TIME")).Inclusive != 53511.75 {
		t.Errorf("mean of .TAU application = %+v", mean)
	}
}

func TestContextUserEventAndMulti(t *testing.T) {
	dir := t.TempDir()
	a := "2 templated_functions_MULTI_TIME\n# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value></attribute><attribute><name>note</name><value><![CDATA[a<b & c]]></value></attribute><attribute><name>q</name><value>it&apos;s &quot;x&quot;</value></attribute></metadata>\n" +
		"\".TAU application\" 1 1 100 1000 0 GROUP=\"TAU_DEFAULT\" \n" +
		"\".TAU application => foo()\" 1 0 900 900 0 GROUP=\"TAU_CALLPATH|TAU_USER\" \n" +
		"0 aggregates\n2 userevents\n# eventname numevents max min mean sumsqr\n" +
		"\"Message size : .TAU application => foo()\" 2 8 4 6 80\n\"bytes\" 1 1.5E+20 1.5E+20 1.5E+20 2.25E+40\n"
	b := "2 templated_functions_MULTI_PAPI_TOT_CYC\n# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>PAPI_TOT_CYC</value></attribute></metadata>\n" +
		"\".TAU application\" 1 1 5000 70000.5 0 GROUP=\"TAU_DEFAULT\" \n" +
		"\".TAU application => foo()\" 1 0 65000.5 65000.5 0 GROUP=\"TAU_CALLPATH|TAU_USER\" \n" +
		"0 aggregates\n2 userevents\n# eventname numevents max min mean sumsqr\n" +
		"\"Message size : .TAU application => foo()\" 2 8 4 6 80\n\"bytes\" 1 1.5E+20 1.5E+20 1.5E+20 2.25E+40\n"
	for name, content := range map[string]string{"MULTI__TIME": a, "MULTI__PAPI_TOT_CYC": b} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "profile.0.0.0"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := ReadDir(dir, "multi")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Metrics) != 2 || tr.Metric("PAPI_TOT_CYC") == nil || tr.Metric("TIME") == nil {
		t.Fatalf("metrics = %v", tr.Metrics)
	}
	if c := tr.Counter("Message size : .TAU application => foo()"); c == nil {
		t.Fatal("context user event not kept whole")
	}
	if tr.Timer("foo()") == nil || tr.Callpath(".TAU application => foo()") == nil {
		t.Fatal("missing intermediate flat timer was not created")
	}
	d := tr.Thread(0).CallDataFor(tr.Callpath(".TAU application => foo()"))
	if v := d.Value(tr.Metric("PAPI_TOT_CYC")); v == nil || v.Exclusive != 65000.5 {
		t.Errorf("second metric value = %+v", v)
	}
	out := t.TempDir()
	if err := WriteDir(out, tr); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"MULTI__TIME": a, "MULTI__PAPI_TOT_CYC": b} {
		got, err := os.ReadFile(filepath.Join(out, name, "profile.0.0.0"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Errorf("%s:\n got %q\nwant %q", name, got, content)
		}
	}
}
