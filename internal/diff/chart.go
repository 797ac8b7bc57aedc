package diff

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"
	"unicode/utf8"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Chart colours of the A and B bars.
var (
	ColorA = color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff}
	ColorB = color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff}
)

// ChartFormats are the formats WriteChart draws.
var ChartFormats = []string{"svg", "png"}

// MaxChartRows bounds the functions drawn in one chart.
const MaxChartRows = 40

// chartLabelRunes bounds a function's label; longer names keep their end
// (the leaf of a call path) after an ellipsis.
const chartLabelRunes = 48

// WriteChart draws r's rows (at most MaxChartRows, in r's order from the
// top) as a horizontal bar chart, one pair of bars (A, B) per function, in
// format svg or png.
func WriteChart(w io.Writer, r *Result, format string) error {
	rows := r.Functions
	if len(rows) > MaxChartRows {
		rows = rows[:MaxChartRows]
	}
	if len(rows) == 0 {
		return fmt.Errorf("chart: no functions to draw")
	}
	scale, unit := 1.0, r.Unit()
	hi := 0.0
	for _, row := range rows {
		hi = math.Max(hi, math.Max(math.Abs(row.A), math.Abs(row.B)))
	}
	if hi == 0 {
		hi = 1
	}
	if unit == "µs" {
		switch {
		case hi >= 1e6:
			scale, unit = 1e-6, "s"
		case hi >= 1e3:
			scale, unit = 1e-3, "ms"
		}
	}
	n := len(rows)
	// Bars are drawn bottom up: the first row goes on top.
	va, vb := make(plotter.Values, n), make(plotter.Values, n)
	names := make([]string, n)
	for i, row := range rows {
		j := n - 1 - i
		va[j], vb[j] = row.A*scale, row.B*scale
		names[j] = chartLabel(row.Name)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: A %s, B %s", r.Title(), r.A.Name, r.B.Name)
	p.X.Label.Text = r.Title()
	if unit != "" {
		p.X.Label.Text += " (" + unit + ")"
	}
	p.X.Min = 0
	// Room on the right for the legend above the longest bar.
	p.X.Max = 1.15 * hi * scale
	const bar = vg.Length(7)
	ba, err := plotter.NewBarChart(va, bar)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	bb, err := plotter.NewBarChart(vb, bar)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	for _, b := range []*plotter.BarChart{ba, bb} {
		b.Horizontal = true
		b.LineStyle.Width = 0
	}
	ba.Color, ba.Offset = ColorA, bar/2
	bb.Color, bb.Offset = ColorB, -bar/2
	p.Add(ba, bb, plotter.NewGrid())
	p.Legend.Add("A", ba)
	p.Legend.Add("B", bb)
	p.Legend.Top = true
	p.NominalY(names...)
	width := 9 * vg.Inch
	height := vg.Length(n)*2.4*bar + 1.5*vg.Inch
	wt, err := p.WriterTo(width, height, format)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("chart: write %s: %w", format, err)
	}
	return nil
}

// chartLabel shortens a function or call path for the chart's axis: each
// node loses its source location ("C [{file} {l,c}-{l,c}]") and its
// parameter list, and a label still too long keeps its end.
func chartLabel(name string) string {
	nodes := strings.Split(name, " => ")
	for i, n := range nodes {
		if j := strings.Index(n, " [{"); j >= 0 {
			n = strings.TrimSuffix(strings.TrimSpace(n[:j]), " C")
		}
		if j := strings.IndexByte(n, '('); j > 0 && strings.HasSuffix(n, ")") {
			n = n[:j] + "()"
		}
		nodes[i] = n
	}
	name = strings.Join(nodes, " => ")
	if utf8.RuneCountInString(name) <= chartLabelRunes {
		return name
	}
	rs := []rune(name)
	return "…" + strings.TrimSpace(string(rs[len(rs)-chartLabelRunes+1:]))
}
