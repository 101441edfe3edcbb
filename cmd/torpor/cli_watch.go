package main

// torpor watch: a line per view change from the server's watch stream (the
// SDK's Watch, which reconnects and resumes after the last seq it got),
// until ^C.

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
)

func (f *clientFlags) watchCmd() *cobra.Command {
	var (
		after  uint64
		labels []string
	)
	cmd := &cobra.Command{
		Use:   "watch [ID|NAME]",
		Short: "print a line per view change (of every sandbox, or of one), until ^C; -o json prints one view a line",
		Long: "watch prints a line per view change: SEQ NAME ID PHASE GEN OUTCOME (wide: and REASON\n" +
			"DRIVER NODE LABELS RESTORE), or one JSON view a line (-o json), or the sandbox's name\n" +
			"(-o name). Without --after it starts with the current view of every sandbox; --after SEQ\n" +
			"shows only changes past that sequence. -l k=v (repeatable: all of them) keeps the views\n" +
			"with those labels. A dropped stream is resumed where it broke; ^C ends it (status 0).",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: f.completeSandboxes(),
		RunE: func(cmd *cobra.Command, args []string) error {
			lf, err := parseLabels(labels)
			if err != nil {
				return err
			}
			c := f.client()
			ctx := cmd.Context()
			// The SDK's Watch retries a server it cannot reach for ever: one
			// read first makes a server that is down (or a sandbox that does
			// not exist) an error.
			only := ""
			if len(args) == 1 {
				v, err := c.Get(ctx, args[0])
				if err != nil {
					return err
				}
				only = v.ID
			} else if _, err := c.Phases(ctx); err != nil {
				return err
			}
			w := &viewLines{out: cmd.OutOrStdout(), o: f.output}
			err = c.Watch(ctx, after, func(v events.View) error {
				if (only != "" && v.ID != only) || !lf.match(v) {
					return nil
				}
				return w.write(v)
			})
			if canceled(ctx, err) {
				return nil
			}
			return err
		},
	}
	cmd.Flags().Uint64Var(&after, "after", 0, "only changes past this sequence")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label k=v (repeatable: all of them)")
	return cmd
}

// viewLines writes views as they come, one a line, in the -o format; the
// columns of a table line up with the widest value seen so far.
type viewLines struct {
	out    io.Writer
	o      string
	widths []int
}

func (w *viewLines) write(v events.View) error {
	switch w.o {
	case outJSON:
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w.out, "%s\n", data)
		return err
	case outName:
		_, err := fmt.Fprintln(w.out, ref(v))
		return err
	}
	row := []string{fmt.Sprint(v.Seq), dash(v.Name), v.ID, string(v.Phase), fmt.Sprint(v.Generation), dash(v.LastOutcome)}
	if w.o == outWide {
		row = append(row, dash(v.Reason), dash(v.Driver), dash(v.Node), dash(labelString(v.Labels)), restoreString(v.Restore))
	}
	if w.widths == nil {
		head := []string{"SEQ", "NAME", "ID", "PHASE", "GEN", "OUTCOME"}
		if w.o == outWide {
			head = append(head, "REASON", "DRIVER", "NODE", "LABELS", "RESTORE")
		}
		// Room for what usually comes: seqs of 8 digits, names of 16, the
		// longest phase.
		w.widths = []int{8, 16, 36, len(events.PhaseProvisioning), 3, len("cold_start_fallback"), len("ComputeResourceMissing"), 6, 8, 16, 8}
		if _, err := fmt.Fprintln(w.out, w.line(head)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w.out, w.line(row))
	return err
}

// line pads each cell but the last to its column's width, widening the
// column when a cell is wider.
func (w *viewLines) line(cells []string) string {
	var b strings.Builder
	for i, c := range cells {
		if i == len(cells)-1 {
			b.WriteString(c)
			break
		}
		w.widths[i] = max(w.widths[i], len(c))
		fmt.Fprintf(&b, "%-*s  ", w.widths[i], c)
	}
	return b.String()
}
