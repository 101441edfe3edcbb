package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
)

// checkCmd is `torpor check [ID|NAME…]`: the invariant checker of
// events/check over the live log of the named sandboxes, or of every one
// the log holds (GET /v1/log/sandboxes: the stream's subjects, not a
// view), read through the history endpoint. Transient stays are judged
// against the server's own deadline (GET /v1/server) unless --deadline
// says otherwise. It exits non-zero when it finds a violation, printing
// each.
func checkCmd(f *clientFlags) *cobra.Command {
	var deadline, slack time.Duration
	var unrecorded bool
	cmd := &cobra.Command{
		Use:   "check [ID|NAME...]",
		Short: "check the invariants of CONTRACT §1 over the live log (every sandbox the log holds when none is named); non-zero on a violation",
		RunE: func(cmd *cobra.Command, args []string) error {
			if deadline < 0 || slack < 0 {
				return invalid(fmt.Errorf("--deadline %s, --slack %s: want 0 or more", deadline, slack))
			}
			c := f.client()
			ctx := cmd.Context()
			if !cmd.Flags().Changed("deadline") {
				srv, err := c.Server(ctx)
				if err != nil {
					return fmt.Errorf("the server's deadline (GET /v1/server; --deadline to give it): %w", err)
				}
				deadline = srv.Deadline()
			}
			ids := make([]string, 0, len(args))
			for _, ref := range args {
				id, err := resolve(cmd, c, ref)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			all := len(args) == 0
			if all {
				var err error
				if ids, err = c.LogSandboxes(ctx); err != nil {
					return err
				}
			}
			refused := 0 // events the lifecycle table refuses: every reader passes over them
			opts := check.Options{Deadline: deadline, Slack: slack, Now: time.Now(), CleanupUnrecorded: unrecorded,
				Refused: func(events.Envelope, error) { refused++ }}
			vs := []check.Violation{}
			n, checked := 0, 0
			for _, id := range ids {
				h, err := c.History(ctx, id, 0)
				if all && errors.Is(err, torpor.ErrNotFound) {
					continue // a subject of foreign messages only: no sandbox
				}
				if err != nil {
					return err
				}
				vs = append(vs, check.Log(envelopes(id, h), opts)...)
				n += len(h)
				checked++
			}
			out := cmd.OutOrStdout()
			if f.output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(vs); err != nil {
					return err
				}
			} else {
				for _, v := range vs {
					fmt.Fprintln(out, v)
				}
				fmt.Fprintf(out, "checked %d sandboxes, %d events: %d violations", checked, n, len(vs))
				if refused > 0 {
					fmt.Fprintf(out, " (%d events the lifecycle table refuses passed over)", refused)
				}
				fmt.Fprintln(out)
			}
			if len(vs) > 0 {
				return events.Errorf(events.CodeInternal, "%d violations of the invariants of CONTRACT §1", len(vs))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&deadline, "deadline", 0, "the deadline of transient phases: a sandbox in one longer than this (and --slack) is stuck; default the server's (GET /v1/server), 0 leaves that out")
	cmd.Flags().DurationVar(&slack, "slack", 10*time.Second, "how much past the deadline a transient phase may last before it counts as stuck")
	cmd.Flags().BoolVar(&unrecorded, "cleanup-unrecorded", false, "the log was written before torpor recorded a deadline's clean-up (sandbox.cleanup_requested): a deadline that ended a phase in error with none asked for is not reported")
	return cmd
}

// envelopes turns sandbox id's history back into the log's envelopes.
func envelopes(id string, h []torpor.Event) []events.Envelope {
	out := make([]events.Envelope, len(h))
	for i, e := range h {
		out[i] = e.Envelope(id)
	}
	return out
}
