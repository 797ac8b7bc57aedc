//go:build !unix

package sqlitestore

import "time"

func cpuTime() time.Duration { return 0 }
