package engine

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// doctorMinGrace is the least the doctor allows a background pass to be
// late: the scheduler sleeps up to a second between passes (its
// MaxWait), whatever the sweep interval.
const doctorMinGrace = 2 * time.Second

// doctorOptions are the doctor's settings: a worker's lease may have
// expired two sweep intervals ago before the doctor calls it a finding
// (the sweeper, on the leader, recovers it within one).
func (e *Engine) doctorOptions() store.DoctorOptions {
	return store.DoctorOptions{Grace: max(2*e.cfg.SweepInterval, doctorMinGrace)}
}

// Doctor runs the store's doctor; see sluice.Backend.
func (e *Engine) Doctor(ctx context.Context) (*sluice.DoctorReport, error) {
	start := time.Now()
	o := e.doctorOptions()
	fs, err := e.st.Doctor(ctx, o)
	if err != nil {
		return nil, err
	}
	return &sluice.DoctorReport{Findings: fs, Repairs: []sluice.CounterRepair{}, Checks: store.DoctorChecks(o),
		Took: sluice.Duration(time.Since(start))}, nil
}

// RepairCounters repairs the counters in one write transaction, then runs
// the doctor again; see sluice.Backend. The doctor runs first, on a
// snapshot: with nothing found there is nothing to repair, and the write
// transaction, whose recounts hold every write for as long as they read
// (about a second on a million tasks), is spared.
func (e *Engine) RepairCounters(ctx context.Context) (*sluice.DoctorReport, error) {
	start := time.Now()
	o := e.doctorOptions()
	report := func(fs []sluice.DoctorFinding, repairs []sluice.CounterRepair) *sluice.DoctorReport {
		if repairs == nil {
			repairs = []sluice.CounterRepair{}
		}
		return &sluice.DoctorReport{Findings: fs, Repairs: repairs, Checks: store.DoctorChecks(o), Took: sluice.Duration(time.Since(start))}
	}
	fs, err := e.st.Doctor(ctx, o)
	if err != nil {
		return nil, err
	}
	if len(fs) == 0 {
		return report(fs, nil), nil
	}
	repairs, out, err := e.st.RepairCounters(ctx)
	if err != nil {
		return nil, err
	}
	e.after(out) // the refill that ended the repair may have readied tasks
	for _, r := range repairs {
		e.log.Warn("doctor repaired a counter", "check", r.Check, "subject", r.Subject, "from", r.From, "to", r.To)
	}
	if fs, err = e.st.Doctor(ctx, o); err != nil {
		return nil, err
	}
	return report(fs, repairs), nil
}
