package main

// torpor replay: the client verb that asks the server's POST /v1/replay
// (services/node) to rebuild a view and shows its progress.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/node"
)

// serverURL is the server the client verbs talk to.
func (f *clientFlags) serverURL() string {
	s := f.server
	if s == "" {
		s = os.Getenv("TORPOR_SERVER")
	}
	if s == "" {
		s = "http://127.0.0.1:8080"
	}
	return strings.TrimRight(s, "/")
}

func replayCmd(f *clientFlags) *cobra.Command {
	var view, until string
	cmd := &cobra.Command{
		Use:   "replay --view kv|sql [--until SEQ|TIME]",
		Short: "rebuild a view from the log and swap it in (--until: build the view of that moment beside the live one)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if view != "kv" && view != "sql" {
				return events.Errorf(events.CodeInvalidArgument, "--view %q: want kv or sql", view)
			}
			if _, _, err := node.UntilOf(until); err != nil {
				return err
			}
			req := map[string]string{"view": view}
			if until != "" {
				req["until"] = until
			}
			body, _ := json.Marshal(req)
			hreq, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, f.serverURL()+"/v1/replay", bytes.NewReader(body))
			if err != nil {
				return events.Errorf(events.CodeInvalidArgument, "--server: %v", err)
			}
			hreq.Header.Set("Content-Type", "application/json")
			if tok := f.tokenValue(); tok != "" {
				hreq.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := f.httpClient().Do(hreq)
			if err != nil {
				return events.Errorf(events.CodeUnavailable, "replay: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				var eb events.ErrorBody
				if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || eb.Error == nil {
					return events.Errorf(events.CodeInternal, "replay: %s from the server", resp.Status)
				}
				return eb.Error
			}
			return showReplay(cmd.OutOrStdout(), resp.Body)
		},
	}
	cmd.Flags().StringVar(&view, "view", "", "the view to rebuild: kv or sql")
	cmd.Flags().StringVar(&until, "until", "", "build the view as it was at this sequence number or RFC 3339 time, beside the live one (never swapped in)")
	return cmd
}

// showReplay shows the progress lines of r: a progress bar (events done of
// total, rate, ETA) when out is a terminal, else a plain line for each.
func showReplay(out io.Writer, r io.Reader) error {
	var bar *progressbar.ProgressBar
	if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(f), progressbar.OptionShowCount(),
			progressbar.OptionShowIts(), progressbar.OptionSetItsString("events"), progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	start := time.Now()
	phase, since, from := "", start, uint64(0)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var l node.ReplayLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return events.Errorf(events.CodeInternal, "replay: a line the server sent does not parse: %v", err)
		}
		switch l.Phase {
		case "failed":
			if bar != nil {
				_ = bar.Exit()
			}
			if l.Error == nil {
				return events.Errorf(events.CodeInternal, "replay of the %s view failed", l.View)
			}
			return l.Error
		case node.ReplayDone:
			if bar != nil {
				_ = bar.Finish()
			}
			elapsed := time.Duration(l.ElapsedMS) * time.Millisecond
			what := "swapped in"
			if strings.Contains(l.Target, "_at_") {
				what = "built beside the live view"
			}
			fmt.Fprintf(out, "replay %s: done at seq %d: %s as %s (%d events read in %s)\n", l.View, l.Seq, what, l.Target, l.Events, elapsed.Round(time.Millisecond))
			return nil
		}
		if l.Phase != phase {
			phase, since, from = l.Phase, time.Now(), l.Done
		}
		if bar != nil {
			bar.ChangeMax64(int64(l.Total))
			bar.Describe(fmt.Sprintf("replay %s: %-8s", l.View, l.Phase))
			_ = bar.Set64(int64(l.Done))
			continue
		}
		rate := ""
		if d := time.Since(since).Seconds(); d > 0.05 && l.Done > from {
			rate = fmt.Sprintf(" (%.0f/s)", float64(l.Done-from)/d)
		}
		fmt.Fprintf(out, "replay %s: %s %d/%d%s\n", l.View, l.Phase, l.Done, l.Total, rate)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return events.Errorf(events.CodeUnavailable, "replay: %v", err)
	}
	return events.Errorf(events.CodeUnavailable, "replay: the server ended the answer before the rebuild was done")
}
