package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// bench holds what the workloads share: the configuration, a small admin
// pool on the bench database, and the machine description.
type bench struct {
	cfg     *config
	poolCfg *pgxpool.Config // River's pool, on the bench database
	admin   *pgxpool.Pool   // bench database, outside the schema
	dbName  string
	machine Machine
}

// newBench connects to --db, creates --database there if it is missing
// (falling back to the --db database if it cannot), and describes the
// machine.
func newBench(ctx context.Context, c *config) (*bench, error) {
	base, err := pgxpool.ParseConfig(c.db)
	if err != nil {
		return nil, fmt.Errorf("--db: %w", err)
	}
	b := &bench{cfg: c, dbName: base.ConnConfig.Database}
	if c.database != "" && c.database != base.ConnConfig.Database {
		if err := createDatabase(ctx, base.ConnConfig, c.database); err != nil {
			fmt.Fprintf(c.progress, "river-bench: cannot create database %q (%v); using %q with schema %q\n", c.database, err, b.dbName, c.schema)
		} else {
			b.dbName = c.database
		}
	}
	adminCfg := base.Copy()
	adminCfg.ConnConfig.Database = b.dbName
	adminCfg.MaxConns = 2
	if b.admin, err = pgxpool.NewWithConfig(ctx, adminCfg); err != nil {
		return nil, err
	}
	if err := b.admin.Ping(ctx); err != nil {
		b.admin.Close()
		return nil, fmt.Errorf("connecting to %s: %w", b.dbName, err)
	}

	b.poolCfg = base.Copy()
	b.poolCfg.ConnConfig.Database = b.dbName
	b.poolCfg.MaxConns = int32(c.poolMaxConns)
	// River is told its schema explicitly (Config.Schema); search_path lets
	// this program's own queries name the tables unqualified.
	b.poolCfg.ConnConfig.RuntimeParams["search_path"] = c.schema

	b.machine = describeMachine()
	_ = b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'), version()`).
		Scan(&b.machine.PostgresVersion, &b.machine.Fsync, &b.machine.SynchronousCommit, &b.machine.PostgresBuild)
	return b, nil
}

func createDatabase(ctx context.Context, cc *pgx.ConnConfig, name string) error {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created concurrently
		return nil
	}
	return err
}

// freshSchema drops and recreates the schema, runs River's migrations in
// it, and opens River's pool on it: every workload starts from empty
// tables.
func (b *bench) freshSchema(ctx context.Context) (*pgxpool.Pool, error) {
	if err := b.dropSchema(ctx); err != nil {
		return nil, err
	}
	if _, err := b.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{b.cfg.schema}.Sanitize()); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, b.poolCfg)
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: b.cfg.schema, Logger: newLogger(b.cfg.progress)})
	if err != nil {
		pool.Close()
		return nil, err
	}
	t0 := time.Now()
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("rivermigrate: %w", err)
	}
	b.logf("schema %s.%s recreated, %d River migrations applied in %s", b.dbName, b.cfg.schema, len(res.Versions), time.Since(t0).Round(time.Millisecond))
	return pool, nil
}

func (b *bench) dropSchema(ctx context.Context) error {
	_, err := b.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{b.cfg.schema}.Sanitize()+" CASCADE")
	return err
}

func (b *bench) close() { b.admin.Close() }

// Machine describes where a run happened (the fields of sluice bench's,
// plus PostgreSQL's).
type Machine struct {
	NumCPU            int    `json:"num_cpu"`
	GOMAXPROCS        int    `json:"gomaxprocs"`
	CPUModel          string `json:"cpu_model"`
	GoVersion         string `json:"go_version"`
	OS                string `json:"os"`
	Arch              string `json:"arch"`
	PostgresVersion   string `json:"postgres_version"`
	PostgresBuild     string `json:"postgres_build"`
	Fsync             string `json:"postgres_fsync"`
	SynchronousCommit string `json:"postgres_synchronous_commit"`
	// LoadAvg is /proc/loadavg's 1-minute load when the run started: the
	// machine is shared, so a high one flags a run to distrust.
	LoadAvg float64 `json:"load_avg_1m"`
}

func describeMachine() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUModel: "unknown"}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 0 {
			m.LoadAvg, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			m.CPUModel = strings.TrimSpace(v)
			break
		}
	}
	return m
}

func (m Machine) String() string {
	return fmt.Sprintf("%d CPUs (%s), GOMAXPROCS %d, %s/%s, %s, load average %.2f at start", m.NumCPU, m.CPUModel, m.GOMAXPROCS, m.OS, m.Arch, m.GoVersion, m.LoadAvg)
}

// riverVersion is the version of River this binary was built with.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return "unknown"
}
