package main

// How a lifecycle verb waits for its target phase: the command itself
// waits for its outcome (?wait=true, one round trip; outcome), and beyond
// the server's 10m, or with --no-wait then `torpor wait`, the server's
// long-poll (GET …/wait, at most 10m a call) looped up to --timeout, for the target
// and, beside it, for each phase the command can settle in instead (a
// rejected suspend is ready again, a failed resume suspended again), so a
// wait that cannot succeed ends as soon as the sandbox settles, with the
// view's outcome and reason in the error. A spinner shows on a terminal,
// plain lines on stderr elsewhere.

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// maxLongPoll is the longest wait the server takes in one call (its
// timeout= caps at 10m).
const maxLongPoll = 10 * time.Minute

// defaultLifecycleTimeout bounds a lifecycle verb's wait without --timeout
// or TORPOR_LIFECYCLE_TIMEOUT.
const defaultLifecycleTimeout = 5 * time.Minute

// settles are, for each verb, the phases other than its target that the
// command can leave the sandbox in for good (CONTRACT §1): the wait ends
// there too, as a failure. The terminal phases (error, deleted) end every
// wait already (the server's wait answers FAILED_PRECONDITION).
var settles = map[string][]events.Phase{
	"suspend": {events.PhaseReady},                          // rejected, timed out
	"resume":  {events.PhaseSuspended, events.PhaseStopped}, // restore failed (retryable); retained state lost
	"stop":    {events.PhaseReady},                          // the driver rejected the stop
}

// gerunds name what a verb is doing, for the progress line.
var gerunds = map[string]string{
	"create": "creating", "start": "starting", "stop": "stopping", "suspend": "suspending",
	"resume": "resuming", "delete": "deleting", "wait": "waiting for",
}

// timeoutOf is the wait's bound: --timeout when given, else
// $TORPOR_LIFECYCLE_TIMEOUT, else defaultLifecycleTimeout.
func timeoutOf(flag time.Duration) (time.Duration, error) {
	if flag > 0 {
		return flag, nil
	}
	if flag < 0 {
		return 0, events.Errorf(events.CodeInvalidArgument, "--timeout %s: want a positive duration", flag)
	}
	if env := os.Getenv("TORPOR_LIFECYCLE_TIMEOUT"); env != "" {
		d, err := time.ParseDuration(env)
		if err != nil || d <= 0 {
			return 0, events.Errorf(events.CodeInvalidArgument, "TORPOR_LIFECYCLE_TIMEOUT=%q: want a positive duration", env)
		}
		return d, nil
	}
	return defaultLifecycleTimeout, nil
}

// waitSettled waits until sandbox id, at a seq above after, is target (the
// view, no error) or one of others or a terminal phase (FAILED_PRECONDITION
// naming verb, the phase, and the view's outcome and reason), or until
// timeout (DEADLINE_EXCEEDED).
func waitSettled(ctx context.Context, c *torpor.Client, verb, id string, target events.Phase, others []events.Phase, after uint64, timeout time.Duration) (events.View, error) {
	deadline := time.Now().Add(timeout)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		v   events.View
		err error
	}
	phases := append([]events.Phase{target}, others...)
	results := make(chan result, len(phases))
	for _, p := range phases {
		go func() {
			v, err := longPoll(wctx, c, id, p, after, deadline)
			results <- result{v, err}
		}()
	}
	var won *result
	for range phases {
		r := <-results
		if won == nil && (r.err == nil || events.CodeOf(r.err) != events.CodeDeadlineExceeded) {
			won = &r
			cancel() // the siblings end; their results are drained here
		}
	}
	if won == nil {
		now := lastView(ctx, c, id)
		return now, events.Errorf(events.CodeDeadlineExceeded, "%s %s: not %s after %s (it is %s); --timeout or TORPOR_LIFECYCLE_TIMEOUT waits longer", verb, refOr(now, id), target, timeout, dash(string(now.Phase)))
	}
	if won.err == nil && won.v.Phase == target {
		return won.v, nil
	}
	if won.err != nil && events.CodeOf(won.err) != events.CodeFailedPrecondition {
		if ctx.Err() != nil {
			return won.v, events.Errorf(events.CodeAborted, "%s %s: the wait was interrupted; the command was accepted and goes on", verb, id)
		}
		return won.v, won.err
	}
	v := won.v
	if won.err != nil {
		v = lastView(ctx, c, id) // the terminal view the server's wait saw
	}
	return v, events.Errorf(events.CodeFailedPrecondition, "%s %s: it ended %s, not %s%s%s", verb, refOr(v, id), dash(string(v.Phase)), target, why(v), refusal(ctx, c, v))
}

// send is a command sent with ?wait=true for at most timeout (the SDK's
// LifecycleWait or CreateWait).
type send func(ctx context.Context, timeout time.Duration) (events.View, error)

// settle sends a command that waits for its outcome in the same request
// (one round trip), showing progress as what (e.g. "suspending demo"), and
// prints the view it ends on; see outcome.
func (f *clientFlags) settle(cmd *cobra.Command, c *torpor.Client, verb, what string, target events.Phase, timeout time.Duration, do send) error {
	p := startProgress(cmd.ErrOrStderr(), gerunds[verb]+" "+what)
	got, err := outcome(cmd.Context(), c, verb, target, timeout, do)
	p.done(got, err)
	if err != nil {
		return err
	}
	return f.show(cmd, got)
}

// outcome sends do and judges its answer as waitSettled judges a wait: the
// view when the sandbox settled in target; FAILED_PRECONDITION naming where
// it settled instead (a rejected suspend: ready), with the view's outcome
// and reason; DEADLINE_EXCEEDED past timeout. A timeout beyond the server's
// cap for one request (10m) goes on with the long poll, as does an answer
// still transient (a server that does not wait: older than ?wait=true).
func outcome(ctx context.Context, c *torpor.Client, verb string, target events.Phase, timeout time.Duration, do send) (events.View, error) {
	start := time.Now()
	v, err := do(ctx, min(timeout, maxLongPoll))
	switch {
	case err == nil && v.Phase.Transient():
		return waitSettled(ctx, c, verb, v.ID, target, settles[verb], v.Seq, timeout-time.Since(start))
	case err == nil && v.Phase == target:
		return v, nil
	case err == nil:
		return v, events.Errorf(events.CodeFailedPrecondition, "%s %s: it ended %s, not %s%s%s", verb, ref(v), dash(string(v.Phase)), target, why(v), refusal(ctx, c, v))
	case ctx.Err() != nil:
		return v, events.Errorf(events.CodeAborted, "%s: the wait was interrupted; a command that was accepted goes on", verb)
	case events.CodeOf(err) != events.CodeDeadlineExceeded || v.ID == "":
		return v, err
	}
	if left := timeout - time.Since(start); left > 0 && timeout > maxLongPoll {
		return waitSettled(ctx, c, verb, v.ID, target, settles[verb], v.Seq, left)
	}
	return v, events.Errorf(events.CodeDeadlineExceeded, "%s %s: not %s after %s (it is %s); --timeout or TORPOR_LIFECYCLE_TIMEOUT waits longer", verb, ref(v), target, timeout, dash(string(v.Phase)))
}

// longPoll loops the server's wait for phase until deadline.
func longPoll(ctx context.Context, c *torpor.Client, id string, phase events.Phase, after uint64, deadline time.Time) (events.View, error) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return events.View{}, events.Errorf(events.CodeDeadlineExceeded, "sandbox %s did not reach %s", id, phase)
		}
		call := max(min(left, maxLongPoll).Round(time.Millisecond), time.Millisecond)
		v, err := c.WaitAfter(ctx, id, phase, after, call)
		if events.CodeOf(err) == events.CodeDeadlineExceeded && ctx.Err() == nil {
			continue
		}
		return v, err
	}
}

// lastView is the sandbox's view now, for a message (empty when it cannot
// be read).
func lastView(ctx context.Context, c *torpor.Client, id string) events.View {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	v, _ := c.Get(ctx, id)
	return v
}

// why is the outcome, reason and exit code of v, for a message.
func why(v events.View) string {
	var parts []string
	if v.LastOutcome != "" {
		parts = append(parts, "outcome "+v.LastOutcome)
	}
	if v.Reason != "" {
		parts = append(parts, "reason "+v.Reason)
	}
	if v.ExitCode != nil {
		parts = append(parts, fmt.Sprintf("exit code %d", *v.ExitCode))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func refOr(v events.View, id string) string {
	if v.ID == "" {
		return id
	}
	return ref(v)
}

// progress shows a wait: a spinner on a terminal, else a line on stderr
// when it ends ("suspending demo … suspended in 18ms"), none for a command
// refused at once.
type progress struct {
	out   io.Writer
	bar   *progressbar.ProgressBar
	start time.Time
	what  string // off a terminal, written with the rest when it ends
}

// startProgress shows that what (e.g. "suspending demo") is under way on
// errOut.
func startProgress(errOut io.Writer, what string) *progress {
	p := &progress{out: errOut, start: time.Now()}
	if terminal(errOut) {
		p.bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(errOut), progressbar.OptionSpinnerType(14),
			progressbar.OptionSetDescription(what), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetRenderBlankState(true), progressbar.OptionClearOnFinish())
		return p
	}
	p.what = what
	return p
}

// done ends the progress: with the phase reached and how long it took, or
// with what the wait ended on.
func (p *progress) done(v events.View, err error) {
	took := time.Since(p.start).Round(time.Millisecond)
	if p.bar != nil {
		_ = p.bar.Exit()
		if err == nil {
			fmt.Fprintf(p.out, "%s %s in %s\n", ref(v), v.Phase, took)
		}
		return
	}
	if v.Phase == "" {
		return // a command refused at once: its error says it all
	}
	fmt.Fprintf(p.out, "%s … ", p.what)
	switch {
	case err == nil:
	case events.CodeOf(err) == events.CodeDeadlineExceeded:
		fmt.Fprintf(p.out, "still %s after %s\n", v.Phase, took)
		return
	default:
		fmt.Fprintf(p.out, "ended %s after %s\n", v.Phase, took)
		return
	}
	fmt.Fprintf(p.out, "%s in %s\n", v.Phase, took)
}

// terminal says whether w is a terminal.
func terminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
