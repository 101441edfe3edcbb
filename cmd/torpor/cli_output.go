package main

// How the client verbs print what they got: -o table (the default), wide,
// json or name, and the client-side label filter of -l.

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// The output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outName  = "name"
)

// outputs are the formats -o takes.
var outputs = []string{outTable, outJSON, outWide, outName}

// checkOutput refuses an -o that is not one of outputs.
func checkOutput(o string) error {
	if slices.Contains(outputs, o) {
		return nil
	}
	return events.Errorf(events.CodeInvalidArgument, "-o %q: want %s", o, strings.Join(outputs, ", "))
}

// printViews prints views in format o: a table (wide: with more columns),
// JSON (one view as an object; a list as {"items":…,"next":…}), or each
// view's name (its id when it has none), one a line. next is the cursor of
// a further page, if any, and total the matches of the list over all its
// pages; list says whether views are a list.
func printViews(out, errOut io.Writer, o string, views []events.View, list bool, next string, total int) error {
	switch o {
	case outJSON:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if !list {
			return enc.Encode(views[0])
		}
		if views == nil {
			views = []events.View{}
		}
		return enc.Encode(torpor.Page{Items: views, Next: next, Total: total})
	case outName:
		for _, v := range views {
			fmt.Fprintln(out, ref(v))
		}
		if next != "" {
			fmt.Fprintf(errOut, "(more: --cursor %s)\n", next)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(viewHeader(o), "\t"))
	for _, v := range views {
		fmt.Fprintln(tw, strings.Join(viewRow(o, v, time.Now()), "\t"))
	}
	if next != "" {
		fmt.Fprintf(tw, "(more: --cursor %s)\n", next)
	}
	return tw.Flush()
}

// viewHeader and viewRow are the columns of a view in a table: table has
// NAME ID PHASE GEN OUTCOME AGE (since the last change); wide adds DRIVER,
// NODE, LABELS, RESTORE, REASON and SEQ.
func viewHeader(o string) []string {
	h := []string{"NAME", "ID", "PHASE", "GEN", "OUTCOME", "AGE"}
	if o == outWide {
		h = append(h, "DRIVER", "NODE", "LABELS", "RESTORE", "REASON", "SEQ")
	}
	return h
}

func viewRow(o string, v events.View, now time.Time) []string {
	r := []string{dash(v.Name), v.ID, string(v.Phase), fmt.Sprint(v.Generation), dash(v.LastOutcome), age(now, v.UpdatedAt)}
	if o == outWide {
		r = append(r, dash(v.Driver), dash(v.Node), dash(labelString(v.Labels)), restoreString(v.Restore), dash(v.Reason), fmt.Sprint(v.Seq))
	}
	return r
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ref is how a sandbox is named to the user: its name, else its id.
func ref(v events.View) string {
	if v.Name != "" {
		return v.Name
	}
	return v.ID
}

// age is how long ago t was, kubectl-style (12s, 5m3s, 2h, 3d).
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func labelString(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	kv := make([]string, len(keys))
	for i, k := range keys {
		kv[i] = k + "=" + l[k]
	}
	return strings.Join(kv, ",")
}

func restoreString(r events.Restore) string {
	switch {
	case r.Held:
		return "held"
	case r.Consumed:
		return "consumed"
	}
	return "-"
}

// printHistory prints a sandbox's history: a table (wide the same), JSON,
// or with name each event's type.
func printHistory(out io.Writer, o string, h []torpor.Event) error {
	switch o {
	case outJSON:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(h)
	case outName:
		for _, e := range h {
			fmt.Fprintln(out, e.Type)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tTYPE\tPHASE\tACTOR\tCOMMAND\tDATA")
	for _, e := range h {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Format(time.RFC3339), e.Type, e.Phase, e.Actor, e.CommandID, e.Data)
	}
	return tw.Flush()
}

// labelFilter is the -l k=v flags: a view matches when it has every one
// (AND).
type labelFilter map[string]string

// parseLabels reads -l flags.
func parseLabels(kvs []string) (labelFilter, error) {
	m, err := pairs(kvs)
	if err != nil {
		return nil, events.Errorf(events.CodeInvalidArgument, "-l: %v", err)
	}
	return labelFilter(m), nil
}

func (l labelFilter) match(v events.View) bool {
	for k, want := range l {
		if got, ok := v.Labels[k]; !ok || got != want {
			return false
		}
	}
	return true
}

// server is the one label the server's list filters on (label=k=v): the
// first of the flags, in a stable order; the others are filtered here.
func (l labelFilter) server() string {
	keys := slices.Sorted(maps.Keys(l))
	if len(keys) == 0 {
		return ""
	}
	return keys[0] + "=" + l[keys[0]]
}
