package sluice

// Environment is the server's cluster-wide flow control as GET
// /v1/environment returns it: the environment limit and the admission
// ceiling, each beside what counts against it. The dashboard's overview
// shows it; MaxActive less Active is the admission headroom.
type Environment struct {
	// MaxRunning is the environment limit on tasks holding a slot
	// (ready or running) across every queue; 0 means unlimited.
	MaxRunning int `json:"max_running"`
	// Running counts the tasks holding an environment slot.
	Running int `json:"running"`
	// MaxActive is the admission ceiling on unfinished tasks of the
	// server that answered (its --max-active); 0 means no ceiling.
	MaxActive int `json:"max_active"`
	// Active counts unfinished (not terminal) tasks.
	Active int `json:"active"`
}
