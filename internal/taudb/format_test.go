package taudb

import (
	"math"
	"strconv"
	"testing"
)

// glibcG16 holds printf("%.16G") of glibc 2.36 for each value (generated
// with a C program; hex literals give the exact doubles).
var glibcG16 = []struct {
	v    float64
	want string
}{
	{0x0p+0, "0"},
	{0x1p+0, "1"},
	{-0x1p+0, "-1"},
	{0x1.c1p+8, "449"},
	{0x1.948ap+15, "51781"},
	{0x1.7555555555555p+6, "93.33333333333333"},
	{0x1.999999999999ap-4, "0.1"},
	{0x1.5555555555555p-2, "0.3333333333333333"},
	{0x1.5555555555555p-1, "0.6666666666666666"},
	{0x1.c6bf52634p+49, "1000000000000000"},
	{0x1.1c37937e08p+53, "1E+16"},
	{0x1.1c37937e08p+53, "1E+16"},
	{0x1.1c37937e07fffp+53, "9999999999999998"},
	{0x1.12210f47de981p+60, "1.234567890123457E+18"},
	{0x1.a36e2eb1c432dp-14, "0.0001"},
	{0x1.4f8b588e368f1p-17, "1E-05"},
	{0x1.02e4b6ce5dc68p-13, "0.00012345"},
	{0x1.9e3abe16fc70dp-17, "1.2345E-05"},
	{0x1.249ad2594c37dp+332, "1E+100"},
	{0x1.bff2ee48e053p-333, "1E-100"},
	{0x0.0000000000001p-1022, "4.940656458412465E-324"},
	{0x1.fffffffffffffp+1023, "1.797693134862316E+308"},
	{0x1p-1022, "2.225073858507201E-308"},
	{0x1.c6bf526340004p+49, "1000000000000000"},
	{0x1.c6bf52634000cp+49, "1000000000000002"},
	{0x1p-1, "0.5"},
	{0x1.c12218377de6bp+46, "123456789012345.7"},
	{0x1.b1ae4d6e2ef5p+69, "1E+21"},
	{0x1.1eb2d66005835p+997, "1.5E+300"},
	{0x1.6f1ec61dfee98p+50, "1614611761068966"},
	{0x1.1d3671ac14c66p-14, "6.8E-05"},
	{0x1.9000000000001p+6, "100"},
	{0x1.d67c8d71d8dd1p-15, "5.608636537493171E-05"},
	{0x1p+52, "4503599627370496"},
	{0x1.3333333333334p-2, "0.3"},
	{0x1.78c29dccccccdp+23, "12345678.9"},
	{0x1.e848p+19, "1000000"},
	{math.Inf(1), "INF"}, {math.Inf(-1), "-INF"}, {math.NaN(), "NAN"},
	{math.Copysign(0, -1), "-0"},
}

func TestFormatG16MatchesGlibc(t *testing.T) {
	for _, tc := range glibcG16 {
		if got := FormatG16(tc.v); got != tc.want {
			t.Errorf("FormatG16(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestFormatGPrecisions(t *testing.T) {
	// printf("%.*G", p, 0.000123456789012345678) for p = 0..17, from glibc.
	want := []string{"0.0001", "0.0001", "0.00012", "0.000123", "0.0001235", "0.00012346", "0.000123457",
		"0.0001234568", "0.00012345679", "0.000123456789", "0.000123456789", "0.00012345678901",
		"0.000123456789012", "0.0001234567890123", "0.00012345678901235", "0.000123456789012346",
		"0.0001234567890123457", "0.00012345678901234567"}
	for p, w := range want {
		if got := FormatG(0.000123456789012345678, p); got != w {
			t.Errorf("FormatG(_, %d) = %q, want %q", p, got, w)
		}
	}
}

// TestFormatG16RoundTrips checks, over many doubles, that a value printed
// and parsed back prints the same (what makes parse-then-write exact).
func TestFormatG16RoundTrips(t *testing.T) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i < 200000; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v := math.Float64frombits(x)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		s := FormatG16(v)
		back, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("FormatG16(%g) = %q does not parse: %v", v, s, err)
		}
		if s2 := FormatG16(back); s2 != s {
			t.Fatalf("FormatG16(%g) = %q, but its value prints %q", v, s, s2)
		}
		if e := strconv.FormatFloat(v, 'E', 15, 64); mustParse(e) != back {
			t.Fatalf("FormatG16(%g) = %q, not the 16-digit rounding %s", v, s, e)
		}
	}
}

func mustParse(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		panic(err)
	}
	return v
}
