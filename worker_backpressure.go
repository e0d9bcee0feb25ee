package sluice

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Backpressure (S-W3): a worker claims min(free slots, claim limit). The
// claim limit starts at ClaimBatch and is halved at each sample (at most
// every 500ms) that finds memory use above MemoryHigh, and again at each
// sample that finds the recent p99 task duration above LatencyHigh; each
// sample below takes one halving back. While any halving is in force the
// worker also claims at most once per sample, so that a smaller claim size
// means a slower intake and not merely more claim calls.

const (
	// DefaultMemoryHigh is WorkerConfig.MemoryHigh's default.
	DefaultMemoryHigh = 0.8
	// memorySampleEvery bounds how often memory and latency are sampled.
	memorySampleEvery = 500 * time.Millisecond
	// latencyWindow is how many recent task durations the p99 is taken over.
	latencyWindow = 1000
)

// Backpressure reasons, as in the sluice_worker_backpressure_active{reason}
// metric.
const (
	reasonMemory  = "memory"
	reasonLatency = "latency"
)

// backpressure computes the claim limit. claimLimit is called by the claim
// loop only; sampleIfDue also by the heartbeat loop; the atomics are read by
// heartbeats and metrics without the lock.
type backpressure struct {
	batch    int
	maxShift int // batch>>maxShift == 1
	memHigh  float64
	latHigh  time.Duration
	every    time.Duration
	sampler  func() (float64, error)
	log      *slog.Logger
	lat      latencyRing

	mu        sync.Mutex
	next      time.Time // next sample due
	memShift  int
	latShift  int
	memFailed bool
	scratch   []int64

	memRatio atomic.Uint64 // math.Float64bits of the last memory sample
	p99      atomic.Int64  // time.Duration of the last latency sample
	limit    atomic.Int64  // current claim limit
	memOn    atomic.Bool
	latOn    atomic.Bool
}

func newBackpressure(cfg WorkerConfig, log *slog.Logger) *backpressure {
	b := &backpressure{
		batch:    cfg.ClaimBatch,
		maxShift: max(bits.Len(uint(max(cfg.ClaimBatch, 1)))-1, 0),
		memHigh:  cfg.MemoryHigh,
		latHigh:  cfg.LatencyHigh,
		every:    memorySampleEvery,
		sampler:  cfg.MemoryUsage,
		log:      log,
	}
	b.limit.Store(int64(cfg.ClaimBatch))
	return b
}

// claimLimit returns how many tasks the next claim may ask for, sampling
// first when a sample is due. wait > 0 means a halving is in force and the
// claim loop should wait that long (for the next sample) before claiming.
func (b *backpressure) claimLimit(now time.Time) (limit int, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !now.Before(b.next) {
		b.sampleLocked(now)
	} else if b.memShift+b.latShift > 0 {
		return 0, b.next.Sub(now)
	}
	return int(b.limit.Load()), 0
}

// piggybackLimit is the claim limit for a claim riding on a complete call,
// without taking a sample (the claim loop paces samples): 0 while
// backpressure holds the claim size down, so the claim loop alone paces
// claims then.
func (b *backpressure) piggybackLimit() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.memShift+b.latShift > 0 {
		return 0
	}
	return int(b.limit.Load())
}

// holding reports whether backpressure holds the claim size down. The
// worker then lets hand-over chains end instead of starting successors,
// so a slot a task frees goes back through a claim (S-W3).
func (b *backpressure) holding() bool { return b.memOn.Load() || b.latOn.Load() }

// sampleIfDue samples when a sample is due, so that an idle worker still
// reports fresh figures in its heartbeats and recovers its claim size.
func (b *backpressure) sampleIfDue(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !now.Before(b.next) {
		b.sampleLocked(now)
	}
}

func (b *backpressure) sampleLocked(now time.Time) {
	b.next = now.Add(b.every)

	ratio := 0.0
	if b.sampler != nil {
		r, err := b.sampler()
		switch {
		case err != nil && !b.memFailed:
			b.memFailed = true
			b.log.Warn("cannot read memory use; memory backpressure is off until it can", "err", err)
		case err == nil && b.memFailed:
			b.memFailed = false
			b.log.Info("memory use readable again", "memory_used_ratio", r)
		}
		if err == nil && r >= 0 && !math.IsNaN(r) {
			ratio = r
		}
	}
	b.memRatio.Store(math.Float64bits(ratio))
	memAbove := b.memHigh > 0 && ratio > b.memHigh
	b.memShift = b.step(b.memShift, memAbove)

	p99 := b.lat.p99(&b.scratch)
	b.p99.Store(int64(p99))
	latAbove := b.latHigh > 0 && p99 > b.latHigh
	b.latShift = b.step(b.latShift, latAbove)

	limit := max(b.batch>>min(b.memShift+b.latShift, b.maxShift), 1)
	b.limit.Store(int64(limit))

	if on := b.memShift > 0; on != b.memOn.Load() {
		b.memOn.Store(on)
		if on {
			b.log.Warn("backpressure on: memory use above memory-high; halving the claim size at each sample",
				"reason", reasonMemory, "memory_used_ratio", ratio, "memory_high", b.memHigh, "claim_size", limit)
		} else {
			b.log.Info("backpressure off: memory use back under memory-high",
				"reason", reasonMemory, "memory_used_ratio", ratio, "memory_high", b.memHigh, "claim_size", limit)
		}
	}
	if on := b.latShift > 0; on != b.latOn.Load() {
		b.latOn.Store(on)
		if on {
			b.log.Warn("backpressure on: p99 task duration above latency-high; halving the claim size at each sample",
				"reason", reasonLatency, "p99", p99, "latency_high", b.latHigh, "claim_size", limit)
		} else {
			b.log.Info("backpressure off: p99 task duration back under latency-high",
				"reason", reasonLatency, "p99", p99, "latency_high", b.latHigh, "claim_size", limit)
		}
	}
}

// step moves a halving count one up (above) or down, within [0, maxShift].
func (b *backpressure) step(shift int, above bool) int {
	if above {
		return min(shift+1, b.maxShift)
	}
	return max(shift-1, 0)
}

func (b *backpressure) memoryRatio() float64 { return math.Float64frombits(b.memRatio.Load()) }

func (b *backpressure) p99Latency() time.Duration { return time.Duration(b.p99.Load()) }

// latencyRing keeps the last latencyWindow task durations. record is
// lock-free: one atomic add and one atomic store per task.
type latencyRing struct {
	n   atomic.Uint64
	buf [latencyWindow]atomic.Int64
}

func (r *latencyRing) record(d time.Duration) {
	i := r.n.Add(1) - 1
	r.buf[i%latencyWindow].Store(int64(d))
}

// p99 returns the 99th percentile (nearest rank) of the recorded
// durations, 0 when there are none. scratch is reused between calls.
func (r *latencyRing) p99(scratch *[]int64) time.Duration {
	n := int(min(r.n.Load(), latencyWindow))
	if n == 0 {
		return 0
	}
	s := (*scratch)[:0]
	for i := range n {
		s = append(s, r.buf[i].Load())
	}
	*scratch = s
	slices.Sort(s)
	rank := int(math.Ceil(0.99*float64(n))) - 1
	return time.Duration(s[rank])
}

// Memory use.
//
// The sampler reads cgroupfs and procfs itself rather than through a
// library: it needs two or three small files, and the cgroup libraries
// (containerd/cgroups, opencontainers/runc/libcontainer) bring in systemd,
// D-Bus and protobuf dependencies for it. prometheus/procfs, already a
// dependency, reads /proc but not cgroup memory limits.

// memorySource says where memory use is read from.
type memorySource struct {
	// cgroup mode: the working set (usage minus inactive file cache, as the
	// kubelet counts it) of the nearest cgroup with a limit, over that limit.
	limitFile, usageFile, statFile, inactiveKey string
	// Otherwise: the process's resident set over the machine's memory.
	statmFile string
	memTotal  int64
	pageSize  int64
}

// String describes the source for the log.
func (s *memorySource) String() string {
	if s.limitFile != "" {
		return "cgroup " + filepath.Dir(s.limitFile)
	}
	return fmt.Sprintf("process RSS over MemTotal (%d MiB)", s.memTotal>>20)
}

// defaultMemoryUsage returns the memory sampler used when
// WorkerConfig.MemoryUsage is nil: on Linux, the working set of the
// nearest cgroup (v2 or v1) that has a memory limit over that limit, else
// the process's resident set over the machine's MemTotal. It fails where
// /proc is not available.
func defaultMemoryUsage() (*memorySource, error) {
	return detectMemorySource("/")
}

// detectMemorySource finds the memory limit that applies to this process.
// root is "/" except in tests.
func detectMemorySource(root string) (*memorySource, error) {
	total, err := readMemTotal(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return nil, err
	}
	src := &memorySource{memTotal: total, pageSize: int64(os.Getpagesize()), statmFile: filepath.Join(root, "proc/self/statm")}
	v2, v1 := cgroupPaths(filepath.Join(root, "proc/self/cgroup"))
	cg := filepath.Join(root, "sys/fs/cgroup")
	if v2 != "" {
		if _, err := os.Stat(filepath.Join(cg, "cgroup.controllers")); err == nil {
			if dir, ok := findLimit(cg, v2, "memory.max", total); ok {
				src.limitFile, src.usageFile = filepath.Join(dir, "memory.max"), filepath.Join(dir, "memory.current")
				src.statFile, src.inactiveKey = filepath.Join(dir, "memory.stat"), "inactive_file"
				return src, nil
			}
		}
	}
	if v1 != "" {
		base := filepath.Join(cg, "memory")
		if dir, ok := findLimit(base, v1, "memory.limit_in_bytes", total); ok {
			src.limitFile, src.usageFile = filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.usage_in_bytes")
			src.statFile, src.inactiveKey = filepath.Join(dir, "memory.stat"), "total_inactive_file"
			return src, nil
		}
	}
	return src, nil
}

// cgroupPaths reads /proc/self/cgroup: the v2 path (the "0::" line) and
// the v1 memory controller's path.
func cgroupPaths(file string) (v2, v1 string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", ""
	}
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		} else if slices.Contains(strings.Split(parts[1], ","), "memory") {
			v1 = parts[2]
		}
	}
	return v2, v1
}

// findLimit walks from the process's cgroup up to the hierarchy's root and
// returns the first directory whose limit file holds a limit below the
// machine's memory. When the cgroup path is not visible (a cgroup
// namespace), the walk starts at the root.
func findLimit(base, cgPath, limitName string, memTotal int64) (string, bool) {
	dir := filepath.Join(base, filepath.FromSlash(cgPath))
	if rel, err := filepath.Rel(base, dir); err != nil || strings.HasPrefix(rel, "..") {
		dir = base
	}
	if _, err := os.Stat(dir); err != nil {
		dir = base
	}
	for {
		if n, err := readInt(filepath.Join(dir, limitName)); err == nil && n > 0 && n < memTotal {
			return dir, true
		}
		if dir == base {
			return "", false
		}
		dir = filepath.Dir(dir)
	}
}

// sample returns the current memory use ratio.
func (s *memorySource) sample() (float64, error) {
	if s.limitFile == "" {
		b, err := os.ReadFile(s.statmFile)
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return 0, fmt.Errorf("%s: unexpected content", s.statmFile)
		}
		pages, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", s.statmFile, err)
		}
		return float64(pages*s.pageSize) / float64(s.memTotal), nil
	}
	limit, err := readInt(s.limitFile)
	if err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, fmt.Errorf("%s: memory limit removed", s.limitFile)
	}
	usage, err := readInt(s.usageFile)
	if err != nil {
		return 0, err
	}
	if inactive, err := statValue(s.statFile, s.inactiveKey); err == nil && inactive < usage {
		usage -= inactive
	}
	return float64(usage) / float64(limit), nil
}

// readInt reads a file holding one integer; "max" (cgroup v2's no limit)
// reads as -1.
func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	return n, nil
}

// statValue reads the number after key in a "key value [unit]" file
// (memory.stat, /proc/meminfo).
func statValue(file, key string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", file, key, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no %s", file, key)
}

// readMemTotal reads MemTotal from /proc/meminfo, in bytes.
func readMemTotal(file string) (int64, error) {
	kb, err := statValue(file, "MemTotal:")
	if err != nil {
		return 0, err
	}
	if kb <= 0 {
		return 0, fmt.Errorf("%s: bad MemTotal %d", file, kb)
	}
	return kb << 10, nil
}
