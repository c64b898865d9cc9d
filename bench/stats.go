package bench

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// quantiles returns the q-quantiles of lat (sorting it in place); zeros
// when lat is empty.
func quantiles(lat []time.Duration, qs ...float64) []time.Duration {
	out := make([]time.Duration, len(qs))
	if len(lat) == 0 {
		return out
	}
	slices.Sort(lat)
	for i, q := range qs {
		idx := int(q*float64(len(lat))+0.5) - 1
		out[i] = lat[min(max(idx, 0), len(lat)-1)]
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times. It is 100
// on every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds is the user+system CPU time so far of the processes pids
// (threads and waited-for children included), from /proc. A process that is
// gone counts 0.
func cpuSeconds(pids []int) float64 {
	var total float64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name (field 2) may hold spaces; fields after it are
		// plain. utime and stime are fields 14 and 15.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		total += (ut + st) / clockTicks
	}
	return total
}

// rssBytes is this process's resident set size, from /proc/self/status.
func rssBytes() (int64, error) { return rssOf(os.Getpid()) }

// rssOf reads the resident set size of process pid (Linux).
func rssOf(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
