package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestWatchAndPhases: /v1/watch streams one server-sent event per view
// change (id: the seq, data: the view) and resumes after Last-Event-ID;
// /v1/phases counts sandboxes per phase.
func TestWatchAndPhases(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "watched"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ready := mustWait(t, c, v.ID, events.PhaseReady)

	read := func(lastID string, until func(events.View) bool) []events.View {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, "http://"+a.HTTPAddr()+"/v1/watch", nil)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		var got []events.View
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		id := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				var view events.View
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &view); err != nil {
					t.Fatalf("data %q: %v", line, err)
				}
				if id != strconv.FormatUint(view.Seq, 10) {
					t.Fatalf("event id %q for a view at seq %d", id, view.Seq)
				}
				got = append(got, view)
				if until(view) {
					return got
				}
			}
		}
		t.Fatalf("stream ended after %d views: %v", len(got), sc.Err())
		return nil
	}
	// From the start: the current views, the sandbox's ready one among them.
	first := read("", func(v events.View) bool { return v.ID == ready.ID && v.Phase == events.PhaseReady })
	if len(first) == 0 {
		t.Fatal("no views")
	}
	// After the ready view: only what changes next.
	if _, err := c.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	next := read(strconv.FormatUint(ready.Seq, 10), func(v events.View) bool { return v.Phase == events.PhaseSuspended })
	for _, view := range next {
		if view.Seq <= ready.Seq {
			t.Fatalf("resumed stream sent seq %d, at or before Last-Event-ID %d", view.Seq, ready.Seq)
		}
	}
	mustWait(t, c, v.ID, events.PhaseSuspended)
	counts, err := c.Phases(ctx)
	if err != nil || counts[events.PhaseSuspended] != 1 || counts[events.PhaseReady] != 0 {
		t.Fatalf("phases %v, %v", counts, err)
	}
	// Wait on a phase the sandbox can no longer reach once it is deleted.
	if _, err := c.Delete(ctx, v.ID, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseDeleted)
	if _, err := c.Wait(ctx, v.ID, events.PhaseReady, 5*time.Second); events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("wait for ready on a deleted sandbox: %v, want FAILED_PRECONDITION", err)
	}
}
