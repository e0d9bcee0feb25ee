package bench

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// pgCPU measures the CPU time PostgreSQL spends while a scenario runs,
// from /proc, when PostgreSQL runs on this machine (Linux):
//
//   - backends: the backend processes serving this scenario's servers,
//     found by their application_name (env.appName, one per env of the
//     run) in pg_stat_activity at each reading; a backend that starts between two readings counts
//     in full, one that ends is lost (the servers' pools keep theirs).
//   - all: every process of the PostgreSQL server, the postmaster's own
//     time plus its children's (backends of every database and session,
//     the WAL writer, checkpointer, autovacuum), with the children that
//     ended counted through the postmaster's cutime and cstime. It
//     includes whatever else uses that PostgreSQL meanwhile.
//
// The kernel counts in clock ticks (USER_HZ, 100 a second on Linux), so
// each reading is good to 10 ms a process.
type pgCPU struct {
	db         *sql.DB
	appNames   []string
	postmaster int // 0: PostgreSQL is not a process of this machine
}

// pgCPUReading is one reading of pgCPU.
type pgCPUReading struct {
	backends map[int]time.Duration
	all      time.Duration
}

// newPGCPU finds the postmaster through the side connection's own
// backend; where that is not a local postgres process, readings are
// empty.
func newPGCPU(ctx context.Context, db *sql.DB, appNames ...string) *pgCPU {
	p := &pgCPU{db: db, appNames: appNames}
	var pid int
	if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return p
	}
	st, ok := readStat(pid)
	if !ok || st.comm != "postgres" {
		return p // another host, or another PID namespace
	}
	if pm, ok := readStat(st.ppid); ok && pm.comm == "postgres" {
		p.postmaster = st.ppid
	}
	return p
}

// ok reports whether readings measure anything.
func (p *pgCPU) ok() bool { return p.postmaster != 0 }

func (p *pgCPU) read(ctx context.Context) pgCPUReading {
	r := pgCPUReading{backends: map[int]time.Duration{}}
	if !p.ok() {
		return r
	}
	for _, app := range p.appNames {
		rows, err := p.db.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE starts_with(application_name, $1)`, app)
		if err != nil {
			continue
		}
		for rows.Next() {
			var pid int
			if rows.Scan(&pid) == nil {
				if st, ok := readStat(pid); ok && st.ppid == p.postmaster {
					r.backends[pid] = st.cpu
				}
			}
		}
		rows.Close()
	}
	if pm, ok := readStat(p.postmaster); ok {
		r.all = pm.cpu + pm.children
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil || pid == p.postmaster {
			continue
		}
		if st, ok := readStat(pid); ok && st.ppid == p.postmaster {
			r.all += st.cpu
		}
	}
	return r
}

// since is the CPU spent from a to r: by this scenario's backends, and by
// all of PostgreSQL.
func (r pgCPUReading) since(a pgCPUReading) (backends, all time.Duration) {
	for pid, cpu := range r.backends {
		backends += cpu - a.backends[pid]
	}
	return backends, r.all - a.all
}

// procStat is what pgCPU reads of /proc/PID/stat.
type procStat struct {
	comm     string
	ppid     int
	cpu      time.Duration // utime + stime
	children time.Duration // cutime + cstime: ended children waited for
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid … utime stime cutime cstime …: comm may hold
	// spaces and parentheses, so fields count from the last ')'.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := bytes.Fields(b[end+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	num := func(i int) int64 { v, _ := strconv.ParseInt(string(f[i]), 10, 64); return v }
	return procStat{
		comm:     string(b[open+1 : end]),
		ppid:     int(num(1)),
		cpu:      time.Duration(num(11)+num(12)) * clockTick,
		children: time.Duration(num(13)+num(14)) * clockTick,
	}, true
}
