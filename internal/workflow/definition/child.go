package definition

// Workflow steps (`workflow: NAME`): a step that starts a run of another
// workflow (a child run) and waits for it. The child's input is the
// step's rendered input and its output is the step's output; its tasks
// take their queue, key, priority, attempts and timeouts from the child
// workflow's own steps, so the step may not set them.

// taskOnlyFields are the step fields that configure a step's tasks: a
// workflow step has none.
var taskOnlyFields = []string{"queue", "concurrency_key", "priority", "max_attempts", "timeout", "dispatch_deadline", "rate_limit"}

// checkWorkflowStep reports what a workflow step may not have: task
// settings, with_items (one child run per item is not supported: fan
// out inside the child workflow), and a reference to its own workflow.
// Deeper cycles (a → b → a) are caught when the runs nest too deeply.
func (p *parser) checkWorkflowStep(d *Definition, i int) {
	s := &d.Steps[i]
	path := stepPath(i)
	if s.Workflow == d.Name && d.Name != "" {
		p.errorf(path+".workflow", "workflow %q cannot start a run of itself: its runs would nest without end", s.Workflow)
	}
	if s.WithItems != nil {
		p.errorf(path+".with_items", "not supported on a workflow step: fan out inside workflow %q (a step with with_items) instead", s.Workflow)
	}
	set := map[string]bool{
		"queue":             s.Queue != "",
		"concurrency_key":   s.ConcurrencyKey != "",
		"priority":          s.Priority != nil,
		"max_attempts":      s.MaxAttempts != nil,
		"timeout":           s.Timeout != "",
		"dispatch_deadline": s.DispatchDeadline != "",
		"rate_limit":        s.RateLimit != nil,
	}
	for _, f := range taskOnlyFields {
		if set[f] {
			p.errorf(path+"."+f, "not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow %q", s.Workflow)
		}
	}
}
