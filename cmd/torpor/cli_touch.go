package main

import (
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
)

// touchCmd is `torpor touch ID|NAME`: it records activity of a sandbox
// (README "Activity"), as POST /v1/sandboxes/{id}/touch does, so a script
// can keep a sandbox from idling; it prints the view, whose last_active_at
// the touch set (or a touch within the server's activity window had).
func (f *clientFlags) touchCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:               "touch ID|NAME",
		Short:             "record activity of a sandbox, so an idle policy counts it as used now",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(events.PhaseProvisioning, events.PhaseReady, events.PhaseStopping, events.PhaseSuspending, events.PhaseSuspended, events.PhaseStarting, events.PhaseStopped),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := f.client()
			cur, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			v, err := c.Touch(cmd.Context(), cur.ID, key)
			if err != nil {
				return err
			}
			return f.show(cmd, v)
		},
	}
	cmd.Flags().StringVar(&key, "idempotency-key", "", "makes a retry of this touch safe")
	return cmd
}
