//go:build !unix

package service

import "time"

func cpuTime() time.Duration { return 0 }
