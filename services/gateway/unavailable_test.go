package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
)

// failingViews answer every read with err.
type failingViews struct{ err error }

func (f failingViews) Get(context.Context, string) (events.View, error) { return events.View{}, f.err }
func (f failingViews) List(context.Context, ListQuery) (events.Page, error) {
	return events.Page{}, f.err
}
func (f failingViews) Wait(context.Context, string, events.Phase, uint64) (events.View, error) {
	return events.View{}, f.err
}
func (f failingViews) Settle(context.Context, string, uint64) (events.View, error) {
	return events.View{}, f.err
}
func (f failingViews) Counts(context.Context) (map[events.Phase]int, error) { return nil, f.err }
func (f failingViews) Watch(context.Context, uint64) (<-chan events.View, error) {
	return nil, f.err
}

// TestTheBusNotAnsweringIsUnavailable: a read that fails because NATS did
// not answer (an election, a server gone, a consumer's heartbeats lost) is
// UNAVAILABLE (503), which clients retry; a wait that got INTERNAL was
// given up by a client that should have asked again (TestClusterFaults in
// CI). Any other failure stays INTERNAL.
func TestTheBusNotAnsweringIsUnavailable(t *testing.T) {
	r := newRig(t)
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		err  error
		want events.Code
	}{
		{fmt.Errorf("list: keys: %w", nats.ErrNoResponders), events.CodeUnavailable},
		{fmt.Errorf("get x: %w", nats.ErrTimeout), events.CodeUnavailable},
		{fmt.Errorf("watch: %w", jetstream.ErrNoHeartbeat), events.CodeUnavailable},
		{fmt.Errorf("put x: %w", jetstream.ErrNoStreamResponse), events.CodeUnavailable},
		{fmt.Errorf("get x: %w", nats.ErrConnectionReconnecting), events.CodeUnavailable},
		{errors.New("the disk is on fire"), events.CodeInternal},
		{events.Errorf(events.CodeFailedPrecondition, "sandbox is stopped"), events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		srv := httptest.NewServer(NewHTTP(svc, failingViews{c.err}, nil, zerolog.Nop()))
		for _, path := range []string{"/v1/sandboxes", "/v1/phases"} {
			code, body := do(t, http.MethodGet, srv.URL+path, "")
			if body.Error == nil || body.Error.Code != c.want || code != c.want.HTTPStatus() {
				t.Errorf("GET %s failing with %q: %d %+v, want %d %s", path, c.err, code, body.Error, c.want.HTTPStatus(), c.want)
			}
		}
		srv.Close()
	}
}
