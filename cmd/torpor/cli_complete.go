package main

// Shell completion: `torpor completion bash|zsh|fish|powershell` is
// cobra's; every verb that names a sandbox completes the names of the
// server's sandboxes (`torpor __complete suspend ""` shows them), each with
// its phase as the description.

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
)

// completePhases are the phases of the sandboxes a lifecycle verb
// completes: those it can act on (every one but deleted when absent).
var completePhases = map[string][]events.Phase{
	"start":   {events.PhaseStopped, events.PhaseSuspended},
	"stop":    {events.PhaseReady},
	"suspend": {events.PhaseReady},
	"resume":  {events.PhaseSuspended},
}

// completeLimit is how many sandboxes a completion reads at most.
const completeLimit = 1000

// completeSandboxes completes the first argument with the names (the ids
// of unnamed ones) of the server's sandboxes that are not deleted and, when
// phases are given, in one of them. A server that does not answer in a few
// seconds completes nothing.
func (f *clientFlags) completeSandboxes(phases ...events.Phase) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 && cmd.Name() != "check" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c := f.client()
		var out []string
		for cursor, n := "", 0; n < completeLimit; {
			p, err := c.List(ctx, "", "", 1000, cursor)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
			}
			for _, v := range p.Items {
				n++
				if v.Phase == events.PhaseDeleted || (len(phases) > 0 && !slices.Contains(phases, v.Phase)) || slices.Contains(args, ref(v)) {
					continue
				}
				if name := ref(v); strings.HasPrefix(name, toComplete) {
					out = append(out, name+"\t"+string(v.Phase))
				}
			}
			if cursor = p.Next; cursor == "" {
				break
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
