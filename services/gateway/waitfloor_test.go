package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
)

// staleViews is a view that answers every wait at once with the view it
// holds, whatever its seq (a replica that lags), and records the floor
// each wait asked for.
type staleViews struct {
	blockingViews
	mu    sync.Mutex
	view  events.View
	after []uint64
}

func (s *staleViews) Wait(_ context.Context, _ string, phase events.Phase, after uint64) (events.View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.after = append(s.after, after)
	if s.view.Seq > after && s.view.Phase == phase {
		return s.view, nil
	}
	return events.View{}, events.Errorf(events.CodeDeadlineExceeded, "not there")
}

// TestWaitIsNoOlderThanTheLog: a wait over HTTP asks the view for a seq at
// least the sandbox's last event when it was asked, so that a view read
// from a replica that lags (a NATS server just back) cannot pass an older
// phase off as the one waited for: a sandbox ready, then suspending, is not
// answered "ready" from the view of before its suspension.
func TestWaitIsNoOlderThanTheLog(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	if _, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "before"}}); err != nil {
		t.Fatal(err) // the sandbox's head is then past 1, its stale view past 0
	}
	v, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "w"}})
	if err != nil {
		t.Fatal(err)
	}
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	head := envs[len(envs)-1].Seq
	views := &staleViews{view: events.View{ID: v.ID, Phase: events.PhaseReady, Seq: head - 1}}
	srv := httptest.NewServer(NewHTTP(svc, views, nil, zerolog.Nop()))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/v1/sandboxes/" + v.ID + "/wait?phase=ready&timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got events.View
	_ = json.NewDecoder(resp.Body).Decode(&got)
	if resp.StatusCode == http.StatusOK {
		t.Errorf("answered %s at seq %d, older than the log's %d", got.Phase, got.Seq, head)
	}
	views.mu.Lock()
	defer views.mu.Unlock()
	if len(views.after) != 1 || views.after[0] != head-1 {
		t.Errorf("the view was asked above %v, want above %d (the log's head %d less one)", views.after, head-1, head)
	}
}

// TestCacheNeverGoesBack: a state folded from an older reading of the log,
// put into the cache after a newer one (a read outside the sandbox's lock
// racing a command), does not replace it.
func TestCacheNeverGoesBack(t *testing.T) {
	svc := newRig(t).service(t)
	svc.put(&Sandbox{ID: "sb", Seq: 5, Phase: events.PhaseStarting})
	svc.put(&Sandbox{ID: "sb", Seq: 3, Phase: events.PhaseSuspended})
	sb, cached, err := svc.load(context.Background(), "sb")
	if err != nil || !cached || sb.Seq != 5 || sb.Phase != events.PhaseStarting {
		t.Fatalf("cached %v seq %d phase %s (err %v), want the state at seq 5, starting", cached, sb.Seq, sb.Phase, err)
	}
	svc.put(&Sandbox{ID: "sb", Seq: 7, Phase: events.PhaseReady})
	if sb, _, _ := svc.load(context.Background(), "sb"); sb.Seq != 7 {
		t.Fatalf("seq %d after a newer state, want 7", sb.Seq)
	}
}
