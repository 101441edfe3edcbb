package torpor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// hibernating is a view as a newer server could send it: a phase this
// build does not know.
const hibernating = events.Phase("hibernating")

func newerView(id string, seq uint64) events.View {
	return events.View{ID: id, Name: "from-the-future", Phase: hibernating, Driver: "sim", Labels: map[string]string{}, Seq: seq, UpdatedAt: time.Now().UTC()}
}

// A view in a phase this SDK does not know decodes and comes back as it
// is, through every decoding path of the HTTP client. The server here is a
// stand-in that speaks our own wire format, the one thing under test: what
// the SDK does with a phase that a real server of this build never sends.
func TestUnknownPhaseHTTP(t *testing.T) {
	ctx := ctxFor(t)
	id := unique()
	v := newerView(id, 7)
	body, _ := json.Marshal(v)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) })
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(events.Page{Items: []events.View{v}})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/suspend", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(body)
	})
	mux.HandleFunc("GET /v1/phases", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprint(w, `{"ready":1,"hibernating":2}`)
	})
	mux.HandleFunc("GET /v1/watch", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "id: %d\ndata: %s\n\n", v.Seq, body)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := torpor.New(srv.URL, nil)

	check := func(what string, got events.View, err error) {
		t.Helper()
		if err != nil || got.Phase != hibernating || got.ID != id || got.Seq != 7 {
			t.Errorf("%s: %+v, %v; want the view, phase %q kept", what, got, err, hibernating)
		}
		if got.Phase.Known() || got.Phase.Terminal() || got.Phase.Transient() {
			t.Errorf("%s: phase %q counts as known, terminal or transient", what, got.Phase)
		}
	}
	got, err := c.Get(ctx, id)
	check("get", got, err)
	got, err = c.Suspend(ctx, id)
	check("suspend", got, err)
	page, err := c.List(ctx, "", "", 0, "")
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("list: %+v, %v", page, err)
	}
	check("list", page.Items[0], nil)
	counts, err := c.Phases(ctx)
	if err != nil || counts[hibernating] != 2 {
		t.Errorf("phases: %v, %v; want hibernating counted", counts, err)
	}
	errGot := errors.New("got it")
	err = c.Watch(ctx, 0, func(w events.View) error {
		check("watch", w, nil)
		return errGot
	})
	if !errors.Is(err, errGot) {
		t.Errorf("watch: %v", err)
	}
}

// The same through the bus client's decoding paths, from a KV bucket of
// the real server holding such a view.
func TestUnknownPhaseBus(t *testing.T) {
	ctx := ctxFor(t)
	nc := connectAs(t, server.nats, server.service) // it makes a bucket
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := "sdk_test_newer_phases"
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), bucket) })
	id := unique()
	body, _ := json.Marshal(newerView(id, 9))
	if _, err := kv.Put(ctx, id, body); err != nil {
		t.Fatal(err)
	}
	b := newBus(t, nc, torpor.WithBucket(bucket))

	got, err := b.Get(ctx, id)
	if err != nil || got.Phase != hibernating || got.Seq != 9 {
		t.Errorf("get: %+v, %v; want phase %q kept", got, err, hibernating)
	}
	page, err := b.List(ctx, "", "", 0, "")
	if err != nil || len(page.Items) != 1 || page.Items[0].Phase != hibernating {
		t.Errorf("list: %+v, %v", page, err)
	}
	counts, err := b.Phases(ctx)
	if err != nil || counts[hibernating] != 1 {
		t.Errorf("phases: %v, %v; want hibernating counted", counts, err)
	}
	errGot := errors.New("got it")
	err = b.Watch(ctx, 0, func(v events.View) error {
		if v.Phase != hibernating || v.ID != id {
			t.Errorf("watch: %+v", v)
		}
		return errGot
	})
	if !errors.Is(err, errGot) {
		t.Errorf("watch: %v", err)
	}
	// A wait goes on through a phase it does not know: it is not terminal.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if v, err := b.Wait(short, id, events.PhaseReady); !errors.Is(err, torpor.ErrDeadlineExceeded) || v.Phase != hibernating {
		t.Errorf("wait for ready: %+v, %v; want DEADLINE_EXCEEDED with the view last seen", v, err)
	}
}
