package gateway

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/torpor/torpor/events"
)

// heldHistory is a view's history that holds the first n events of the log
// (a view that lags), or fails.
type heldHistory struct {
	envs []events.Envelope
	err  error
}

func (h heldHistory) History(_ context.Context, _ string, after uint64) ([]events.Envelope, error) {
	if h.err != nil {
		return nil, h.err
	}
	var out []events.Envelope
	for _, e := range h.envs {
		if e.Seq > after {
			out = append(out, e)
		}
	}
	return out, nil
}

var _ Histories = heldHistory{}

// TestHistoryFromAViewThatLags: the history read from a view is the log's
// whatever the view holds of it (all, a prefix, nothing), after any seq; an
// unknown sandbox is NOT_FOUND and a view that fails says so.
func TestHistoryFromAViewThatLags(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	v := readySandbox(t, svc)
	if _, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	log, err := svc.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(log) < 3 {
		t.Fatalf("log of %d events, want 3 or more", len(log))
	}
	seqs := func(envs []events.Envelope) []uint64 {
		var s []uint64
		for _, e := range envs {
			s = append(s, e.Seq)
		}
		return s
	}
	for held := 0; held <= len(log); held++ {
		for _, after := range []uint64{0, log[0].Seq, log[len(log)-1].Seq} {
			got, err := svc.HistoryFrom(ctx, v.ID, after, heldHistory{envs: log[:held]})
			if err != nil {
				t.Fatalf("view holding %d, after %d: %v", held, after, err)
			}
			want, _ := svc.History(ctx, v.ID, after)
			if !reflect.DeepEqual(seqs(got), seqs(want)) {
				t.Errorf("view holding %d, after %d: seqs %v, want the log's %v", held, after, seqs(got), seqs(want))
			}
		}
	}
	if _, err := svc.HistoryFrom(ctx, "0190a0c2-0000-7000-8000-000000000000", 0, heldHistory{}); events.CodeOf(err) != events.CodeNotFound {
		t.Errorf("unknown sandbox: %v, want NOT_FOUND", err)
	}
	down := errors.New("database down")
	if _, err := svc.HistoryFrom(ctx, v.ID, 0, heldHistory{err: down}); !errors.Is(err, down) {
		t.Errorf("failing view: %v, want its error", err)
	}
}
