package sluice

// DoctorReport is what the doctor found: GET /v1/doctor (Backend.Doctor)
// and POST /v1/doctor/repair (Backend.RepairCounters) answer one, and
// `sluice doctor` prints it.
//
// The doctor recomputes every counter the flow control keeps (the
// environment's, each queue's and sub-queue's, the slots lent to waiting
// parents, each workflow step's window, each workflow's run places) from
// the rows they count, and looks for what no transaction leaves behind:
// a window over its limit, a parent waiting for a child that no longer
// exists, a worker whose lease expired more than two sweep intervals ago.
// The counters are exact at every commit, so a healthy database, however
// busy, has no finding.
type DoctorReport struct {
	// Findings are what the checks found, one per thing wrong (none on a
	// healthy database). After a repair, they are what the checks find
	// once the repair committed: what it could not repair.
	Findings []DoctorFinding `json:"findings"`
	// Repairs are the counters a repair changed, each with its old and
	// new value; empty for GET /v1/doctor, and for a repair that found
	// every counter right.
	Repairs []CounterRepair `json:"repairs"`
	// Checks is how many checks ran.
	Checks int `json:"checks"`
	// Took is how long the checks (and the repair) took on the server.
	Took Duration `json:"took"`
}

// DoctorFinding is one thing the doctor found wrong.
type DoctorFinding struct {
	// Check names the check: "sub-queue running", "step over window",
	// "expired lease" … (docs/operations.md lists them).
	Check string `json:"check"`
	// Subject is the row it is about: "env", a queue name,
	// "queue/key" for a sub-queue (key empty for the tasks without
	// one), "workflow/key" for run places, "step 12", "task 7",
	// "worker w-1".
	Subject string `json:"subject"`
	// Have and Want are what the check compares: for a counter, its
	// value and the number its rows give; for a limit, the value and
	// the limit; otherwise as Message says.
	Have int64 `json:"have"`
	Want int64 `json:"want"`
	// Repairable: a counter that RepairCounters sets to Want.
	Repairable bool `json:"repairable"`
	// Message says what is wrong, in words.
	Message string `json:"message"`
	// Fix says what to do about it.
	Fix string `json:"fix"`
}

// CounterRepair is one counter a repair changed.
type CounterRepair struct {
	// Check and Subject are those of the finding it repaired.
	Check   string `json:"check"`
	Subject string `json:"subject"`
	// From is the counter's value before the repair, To the number its
	// rows gave.
	From int64 `json:"from"`
	To   int64 `json:"to"`
}
