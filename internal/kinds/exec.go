package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/sluice-dev/sluice"
)

type execInput struct {
	Command []string `json:"command"`
	Timeout *string  `json:"timeout"`
}

type execOutput struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Truncated is set when stdout or stderr passed MaxOutput bytes.
	Truncated bool `json:"truncated,omitempty"`
}

// waitDelay bounds the wait for output pipes after the process ends or is
// killed (a child that kept them open).
const waitDelay = 5 * time.Second

// execHandler runs input.command directly, without a shell, with the
// worker's environment and no standard input. A zero exit succeeds with
// {"exit_code", "stdout", "stderr"}; a non-zero exit or a timeout fails the
// attempt (retried); a command that cannot start fails the task. The
// optional input.timeout bounds the command; the task's own timeout applies
// regardless.
func execHandler(ctx context.Context, t *sluice.TaskContext) (json.RawMessage, error) {
	in, timeout, err := parseExec(t.Input)
	if err != nil {
		return nil, err
	}
	cctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(cctx, in.Command[0], in.Command[1:]...)
	var stdout, stderr cappedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, sluice.NoRetry(fmt.Errorf("exec: starting %q: %w", in.Command[0], err))
	}
	err = cmd.Wait()
	out := execOutput{
		ExitCode:  cmd.ProcessState.ExitCode(),
		Stdout:    stdout.buf.String(),
		Stderr:    stderr.buf.String(),
		Truncated: stdout.truncated || stderr.truncated,
	}
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return nil, fmt.Errorf("exec: %q: timed out after %s", in.Command[0], timeout)
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("exec: %q: %v%s", in.Command[0], ee, snippet(out.Stderr))
		}
		return nil, fmt.Errorf("exec: %q: %w", in.Command[0], err)
	}
	return json.Marshal(out)
}

// parseExec decodes and checks the exec kind's input: the handler and
// validateExec both call it. Whether the program exists is known only on
// the worker that runs it.
func parseExec(raw json.RawMessage) (execInput, time.Duration, error) {
	var in execInput
	if err := decodeInput("exec", raw, &in); err != nil {
		return in, 0, err
	}
	if len(in.Command) == 0 || in.Command[0] == "" {
		return in, 0, badInput("exec", "command", "required: the program and its arguments, e.g. [\"ls\", \"-l\"]")
	}
	timeout, err := duration("exec", "timeout", in.Timeout, 0)
	return in, timeout, err
}
