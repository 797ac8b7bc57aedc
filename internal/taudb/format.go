package taudb

import (
	"math"
	"strconv"
	"strings"
)

// FormatG returns v formatted as C's printf("%.<prec>G") does (glibc): prec
// significant digits (1 if prec is 0), correctly rounded half to even on the
// exact binary value; exponent form "1.5E+20" when the decimal exponent X is
// below -4 or at least prec, otherwise fixed form; trailing zeros and a
// trailing point removed; exponent with a sign and at least two digits;
// "INF", "-INF", "NAN" and "-NAN" for the special values.
func FormatG(v float64, prec int) string {
	return string(AppendG(nil, v, prec))
}

// FormatG16 is FormatG(v, 16), TAU's format for profile values.
func FormatG16(v float64) string { return FormatG(v, 16) }

// AppendG appends FormatG(v, prec) to dst.
func AppendG(dst []byte, v float64, prec int) []byte {
	switch {
	case math.IsNaN(v):
		if math.Signbit(v) {
			return append(dst, "-NAN"...)
		}
		return append(dst, "NAN"...)
	case math.IsInf(v, 1):
		return append(dst, "INF"...)
	case math.IsInf(v, -1):
		return append(dst, "-INF"...)
	}
	if prec == 0 {
		prec = 1
	}
	if prec < 0 {
		prec = 6
	}
	// Round once to prec significant digits; the exponent of that result
	// decides the style, as in C.
	var buf [40]byte
	e := strconv.AppendFloat(buf[:0], v, 'E', prec-1, 64)
	ei := strings.LastIndexByte(string(e), 'E')
	x, _ := strconv.Atoi(string(e[ei+1:]))
	if x < -4 || x >= prec {
		mant := trimZeros(e[:ei])
		dst = append(dst, mant...)
		dst = append(dst, 'E')
		if x < 0 {
			dst = append(dst, '-')
			x = -x
		} else {
			dst = append(dst, '+')
		}
		if x < 10 {
			dst = append(dst, '0')
		}
		return strconv.AppendInt(dst, int64(x), 10)
	}
	f := strconv.AppendFloat(buf[:0], v, 'f', prec-1-x, 64)
	return append(dst, trimZeros(f)...)
}

func trimZeros(b []byte) []byte {
	if !strings.ContainsRune(string(b), '.') {
		return b
	}
	for len(b) > 0 && b[len(b)-1] == '0' {
		b = b[:len(b)-1]
	}
	if len(b) > 0 && b[len(b)-1] == '.' {
		b = b[:len(b)-1]
	}
	return b
}
