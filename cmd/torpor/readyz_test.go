package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestReadyzWhileTheViewIsStuck: a KV view that cannot apply an event (its
// bucket gone from under it) keeps retrying it, and /readyz answers 503
// UNAVAILABLE naming the stuck view, where before the view was stuck it
// answered 200.
func TestReadyzWhileTheViewIsStuck(t *testing.T) {
	a := startApp(t, "", nil)
	base := "http://" + a.HTTPAddr()
	readyz := func() (int, string) {
		t.Helper()
		resp, err := anonymous.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var eb events.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		msg := ""
		if eb.Error != nil {
			msg = string(eb.Error.Code) + ": " + eb.Error.Message
		}
		return resp.StatusCode, msg
	}
	ctx := context.Background()
	c := appClient(a)
	readySim(t, c, "before")
	if status, msg := readyz(); status != http.StatusOK {
		t.Fatalf("/readyz before: %d %s", status, msg)
	}
	js, _ := jetstream.New(busConn(t, a))
	if err := js.DeleteKeyValue(ctx, "torpor_phases"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "after", Driver: "sim"}, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/readyz 503 naming the stuck view", func() bool {
		status, msg := readyz()
		return status == http.StatusServiceUnavailable && strings.HasPrefix(msg, "UNAVAILABLE: ") && strings.Contains(msg, "retried")
	})
}

// TestReadyzWhileTheSQLViewIsStuck: the SQL view that cannot apply an event
// (a constraint added under it refuses the event's row, on a real
// PostgreSQL) keeps retrying it, and /readyz answers 503 UNAVAILABLE naming
// the SQL view and the event it retries, where before it answered 200; the
// constraint dropped, the view applies the event and /readyz is ready again.
func TestReadyzWhileTheSQLViewIsStuck(t *testing.T) {
	db, schema := sqlSchema(t)
	a := startApp(t, "", func(c *serveConfig) { c.ProjectionDB = db })
	ctx := context.Background()
	c := appClient(a)
	readySim(t, c, "before")
	viewsCaughtUp(t, a)
	if code, msg := readyz(t, a); code != http.StatusOK {
		t.Fatalf("/readyz before: %d %s", code, msg)
	}
	psql(t, testDatabase(t), "ALTER TABLE "+schema+".torpor_sandboxes ADD CONSTRAINT no_after CHECK (name <> 'after')")
	w, err := c.Create(ctx, torpor.CreateRequest{Name: "after", Driver: "sim"}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, w.ID, events.PhaseReady) // the KV view follows; the SQL view cannot
	untilTrue(t, "/readyz 503 naming the stuck SQL view", func() (bool, string) {
		code, msg := readyz(t, a)
		return code == http.StatusServiceUnavailable && strings.Contains(msg, "SQL view") && strings.Contains(msg, "retried"), fmt.Sprintf("%d %s", code, msg)
	})
	psql(t, testDatabase(t), "ALTER TABLE "+schema+".torpor_sandboxes DROP CONSTRAINT no_after")
	viewsCaughtUp(t, a)
	untilTrue(t, "/readyz ready again", func() (bool, string) {
		code, msg := readyz(t, a)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, msg)
	})
}
