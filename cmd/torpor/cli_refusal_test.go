package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestResumeRefusalSaysWhy (issue 29): a resume that ends suspended because
// its target cannot restore the state says, FAILED_PRECONDITION, what the
// target said (from the history); another failed resume says what it did.
func TestResumeRefusalSaysWhy(t *testing.T) {
	const id = "0193b0a4-0000-7000-8000-000000000001"
	words := "node n2 cannot restore the retained state: the snapshot's machine type pc-q35-9.2 is not in QEMU 7.2.22 here"
	data, _ := json.Marshal(events.ResumeFailed{Generation: 2, Node: "n2", Reason: events.ReasonCannotRestore, Message: words})
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++
		if r.URL.Path != "/v1/sandboxes/"+id+"/events" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(events.History{Items: []events.HistoryEntry{
			{Seq: 6, Type: events.TypeResumeRequested, Data: json.RawMessage(`{"generation":2,"restore_ref":"r","node":"n2"}`)},
			{Seq: 7, Type: events.TypeResumeFailed, Data: data},
		}})
	}))
	t.Cleanup(srv.Close)
	c := torpor.New(srv.URL, srv.Client())
	for _, tc := range []struct {
		name   string
		reason string
		want   string
		asks   int
	}{
		{"refused by the target", events.ReasonCannotRestore, "(outcome restore_failed, reason CannotRestore); " + words, 1},
		{"failed otherwise", "", "(outcome restore_failed)", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = 0
			v := events.View{ID: id, Name: "demo", Phase: events.PhaseSuspended, LastOutcome: events.OutcomeRestoreFailed, Reason: tc.reason, Seq: 7}
			_, err := outcome(context.Background(), c, "resume", events.PhaseReady, time.Minute, func(context.Context, time.Duration) (events.View, error) { return v, nil })
			if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.HasSuffix(err.Error(), "it ended suspended, not ready "+tc.want) {
				t.Errorf("got %v (%s), want FAILED_PRECONDITION ending %q", err, events.CodeOf(err), tc.want)
			}
			if asked != tc.asks {
				t.Errorf("the history was read %d times, want %d", asked, tc.asks)
			}
		})
	}
}
