package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
)

// touchesOf counts the sandbox.active events of source touch in id's history.
func touchesOf(t *testing.T, c *torpor.Client, id string) int {
	t.Helper()
	h, err := c.History(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range h {
		var a events.Active
		if e.Type == events.TypeActive && json.Unmarshal(e.Data, &a) == nil && a.Source == events.ActiveTouch {
			n++
		}
	}
	return n
}

// TestTouchOnTheBus: torpor.cmd.touch records activity as the HTTP route
// does: a producer's touch appends one sandbox.active of source touch and
// answers the view with last_active_at; a second within the activity
// window appends nothing; an unknown sandbox is NOT_FOUND and a body
// without an id INVALID_ARGUMENT. A dashboard's credentials, which read
// and never command, are refused by the NATS server itself.
func TestTouchOnTheBus(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	v := readySim(t, c, "touched")
	before := touchesOf(t, c, v.ID)

	opts, err := a.NATSOptionsAs(busauth.Grant{Role: busauth.Dashboard})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(refusals, 4)
	dash, err := nats.Connect(a.NATSURL(), append(opts, nats.ErrorHandler(errs.handler))...)
	if err != nil {
		t.Fatal(err)
	}
	defer dash.Close()
	if err := dash.PublishMsg(&nats.Msg{Subject: "torpor.cmd.touch", Reply: dash.NewRespInbox(), Data: []byte(`{"id":"` + v.ID + `"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := dash.Flush(); err != nil {
		t.Fatal(err)
	}
	errs.want(t, "torpor.cmd.touch")
	if n := touchesOf(t, c, v.ID); n != before {
		t.Fatalf("the dashboard's touch appended: %d touches, %d before", n, before)
	}

	prod, err := torpor.NewBus(busConnAs(t, a, busauth.Grant{Role: busauth.Producer}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := prod.Touch(ctx, v.ID, "")
	if err != nil {
		t.Fatalf("a producer's touch: %v", err)
	}
	if got.ID != v.ID || got.LastActiveAt.IsZero() {
		t.Errorf("the touch answered %+v, want the view with last_active_at", got)
	}
	if _, err := prod.Touch(ctx, v.ID, ""); err != nil {
		t.Fatalf("a second touch: %v", err)
	}
	if n := touchesOf(t, c, v.ID); n != before+1 {
		t.Errorf("two touches within the window: %d sandbox.active of source touch, want %d", n-before, 1)
	}
	if _, err := prod.Touch(ctx, "0193b0a4-0000-7000-8000-00000000dead", ""); events.CodeOf(err) != events.CodeNotFound {
		t.Errorf("a touch of an unknown sandbox: %v, want NOT_FOUND", err)
	}
	if _, cerr := busCmd(t, busConn(t, a), "touch", map[string]any{}, nil); cerr == nil || cerr.Code != events.CodeInvalidArgument {
		t.Errorf("a touch without an id: %v, want INVALID_ARGUMENT", cerr)
	}
}

// TestTouchFromTheCLI: `torpor touch NAME` records activity and prints the
// view with last_active_at; an unknown name exits with NOT_FOUND's status;
// a read token is refused (PERMISSION_DENIED's status) and appends nothing.
func TestTouchFromTheCLI(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	v := readySim(t, c, "poked")
	srv := "http://" + a.HTTPAddr()
	before := touchesOf(t, c, v.ID)

	read, err := c.CreateToken(ctx, torpor.TokenRequest{Name: "reader", Scopes: []events.Scope{events.ScopeRead}})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := cli(t, srv, "--token", read.Token, "touch", "poked"); code != 10 {
		t.Errorf("touch with a read token: exit %d (%s), want PERMISSION_DENIED's 10 (README, exit statuses)", code, stderr)
	}
	if n := touchesOf(t, c, v.ID); n != before {
		t.Fatalf("a refused touch appended: %d touches, %d before", n, before)
	}

	code, out, stderr := cli(t, srv, "touch", "poked", "-o", "json")
	if code != 0 {
		t.Fatalf("torpor touch poked: exit %d, %s", code, stderr)
	}
	var got events.View
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.ID != v.ID || got.LastActiveAt.IsZero() {
		t.Errorf("torpor touch printed %q (%v), want the view with last_active_at", out, err)
	}
	if n := touchesOf(t, c, v.ID); n != before+1 {
		t.Errorf("torpor touch: %d touches more, want 1", n-before)
	}
	if code, _, _ := cli(t, srv, "touch", "no-such-sandbox"); code != 3 {
		t.Errorf("touch of an unknown name: exit %d, want NOT_FOUND's 3", code)
	}
}
