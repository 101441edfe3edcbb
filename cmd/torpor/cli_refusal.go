package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// refusal is, for a sandbox whose resume ended suspended because its
// target said it cannot restore the state (issue 29: reason
// CannotRestore), the target's words from the history, for the wait's
// message ("; node n2 cannot restore …"); "" otherwise, or when the
// history cannot be read.
func refusal(ctx context.Context, c *torpor.Client, v events.View) string {
	if v.Reason != events.ReasonCannotRestore || v.ID == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	items, err := c.History(ctx, v.ID, v.Seq-min(v.Seq, 16))
	if err != nil {
		return ""
	}
	for i := len(items) - 1; i >= 0; i-- {
		if items[i].Type != events.TypeResumeFailed {
			continue
		}
		var f events.ResumeFailed
		if json.Unmarshal(items[i].Data, &f) != nil || f.Reason != events.ReasonCannotRestore || f.Message == "" {
			return ""
		}
		return "; " + f.Message
	}
	return ""
}
