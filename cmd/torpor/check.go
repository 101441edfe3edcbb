package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
)

// checkCmd is `torpor check [ID|NAME…]`: the invariant checker of
// events/check over the live log of the named sandboxes, or of every one
// the server lists, read through the history endpoint. It exits non-zero
// when it finds a violation, printing each.
func checkCmd(f *clientFlags) *cobra.Command {
	var deadline, slack time.Duration
	cmd := &cobra.Command{
		Use:   "check [ID|NAME...]",
		Short: "check the invariants of CONTRACT §1 over the live log (every sandbox when none is named); non-zero on a violation",
		RunE: func(cmd *cobra.Command, args []string) error {
			if deadline < 0 || slack < 0 {
				return invalid(fmt.Errorf("--deadline %s, --slack %s: want 0 or more", deadline, slack))
			}
			c := f.client()
			ctx := cmd.Context()
			ids := make([]string, 0, len(args))
			for _, ref := range args {
				id, err := resolve(cmd, c, ref)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			if len(args) == 0 {
				for cursor := ""; ; {
					p, err := c.List(ctx, "", "", 1000, cursor)
					if err != nil {
						return err
					}
					for _, v := range p.Items {
						ids = append(ids, v.ID)
					}
					if cursor = p.Next; cursor == "" {
						break
					}
				}
			}
			refused := 0 // events the lifecycle table refuses: every reader passes over them
			opts := check.Options{Deadline: deadline, Slack: slack, Now: time.Now(),
				Refused: func(events.Envelope, error) { refused++ }}
			vs := []check.Violation{}
			n := 0
			for _, id := range ids {
				h, err := c.History(ctx, id, 0)
				if err != nil {
					return err
				}
				vs = append(vs, check.Log(envelopes(id, h), opts)...)
				n += len(h)
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
				fmt.Fprintf(out, "checked %d sandboxes, %d events: %d violations", len(ids), n, len(vs))
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
	cmd.Flags().DurationVar(&deadline, "deadline", 2*time.Minute, "the server's --deadline: a sandbox in a transient phase longer than this (and --slack) is stuck; 0 leaves that out")
	cmd.Flags().DurationVar(&slack, "slack", 10*time.Second, "how much past --deadline a transient phase may last before it counts as stuck")
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
