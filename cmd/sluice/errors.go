package main

import (
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
)

// explain returns the message printed for err, the error of cmd: for
// the errors a user can fix where sluice runs (no server at --server, a
// missing or rejected token), a message that says what to set, naming
// the flag and the environment variables the command reads; any other
// error as it is. What came before the client's error in the message
// ("waiting for task 7: ") is kept.
func (a *app) explain(cmd *cobra.Command, err error) string {
	msg := err.Error()
	if cmd == nil {
		return msg
	}
	if s, ok := a.explainUnreachable(cmd, err); ok {
		return s
	}
	if s, ok := a.explainToken(cmd, err); ok {
		return s
	}
	return msg
}

// explainUnreachable explains a call to the server that made no
// connection. The worker is left alone: it waits for its server
// (--connect-timeout), and its message says so.
func (a *app) explainUnreachable(cmd *cobra.Command, err error) (string, bool) {
	var op *net.OpError
	var ue *url.Error
	if cmd.Name() == "worker" || !errors.As(err, &op) || op.Op != "dial" || !errors.As(err, &ue) {
		return "", false
	}
	reason := op.Err.Error()
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "connection refused"
	case errors.As(err, &dns) && dns.IsNotFound:
		reason = "no such host " + dns.Name
	case op.Timeout():
		reason = "timed out"
	}
	where := serverOf(ue.URL)
	if f := cmd.Flags().Lookup("server"); f != nil && strings.Contains(f.Value.String(), ",") {
		where = "any of " + f.Value.String()
	}
	return prefixOf(err, wrapperOf(err, ue)) + "cannot reach the sluice server at " + where + " (" + reason + "): is it running? (set " +
		flagAndEnv(cmd.Flags().Lookup("server"), "--server or SLUICE_SERVER") + ")", true
}

// explainToken explains a 401 (no token, or one the server does not
// know) or 403 (the worker token on an admin route): which token the
// command needs and how to give it. The code (unauthorized, forbidden)
// stays in the message.
func (a *app) explainToken(cmd *cobra.Command, err error) (string, bool) {
	var e *sluice.Error
	if !errors.As(err, &e) || (e.Code != sluice.CodeUnauthorized && e.Code != sluice.CodeForbidden) {
		return "", false
	}
	f := cmd.Flags().Lookup("token")
	if f == nil {
		return "", false
	}
	need := "admin token (its --admin-token)"
	if slices.Contains(f.Annotations[envAnnotation], "SLUICE_WORKER_TOKEN") {
		need = "worker token (its --worker-token)"
	}
	give := "set " + flagAndEnv(f, "--token") + " to the server's " + need
	where := ""
	if s := cmd.Flags().Lookup("server"); s != nil {
		where = " at " + s.Value.String()
	}
	var what string
	switch {
	case e.Code == sluice.CodeForbidden:
		what = "the server" + where + " refused the token for this command (" + e.Error() + ")"
	case f.Value.String() == "":
		what = "the server" + where + " needs a token and none was given (" + e.Code + ")"
	default:
		from := "--token"
		if v, ok := a.envSources[f.Name]; ok && !f.Changed {
			from = v
		}
		what = "the server" + where + " rejected the token given by " + from + " (" + e.Error() + ")"
	}
	return prefixOf(err, e) + what + ": " + give, true
}

// flagAndEnv names a flag and the environment variables bound to it:
// "--token or SLUICE_TOKEN (else SLUICE_ADMIN_TOKEN)". With no flag, it
// returns def.
func flagAndEnv(f *pflag.Flag, def string) string {
	if f == nil {
		return def
	}
	s := "--" + f.Name
	vars := f.Annotations[envAnnotation]
	if len(vars) > 0 {
		s += " or " + vars[0]
	}
	if len(vars) > 1 {
		s += " (else " + strings.Join(vars[1:], ", else ") + ")"
	}
	return s
}

// prefixOf is what err's message says before the message of replaced,
// the error in err's chain that the explanation replaces: the context
// the command added ("waiting for task 7: "), or "".
func prefixOf(err, replaced error) string {
	if p, ok := strings.CutSuffix(err.Error(), replaced.Error()); ok {
		return p
	}
	return ""
}

// wrapperOf returns the error of err's chain that wraps inner directly
// (the client's "sluice: GET URL: …" around the *url.Error), or inner.
func wrapperOf(err, inner error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if errors.Unwrap(e) == inner {
			return e
		}
	}
	return inner
}

// serverOf is the base URL of a request URL: what comes before /v1/.
func serverOf(requestURL string) string {
	if i := strings.Index(requestURL, "/v1/"); i >= 0 {
		return requestURL[:i]
	}
	return requestURL
}
