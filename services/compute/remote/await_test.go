package remote_test

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/remote"
)

// awaiter is the fake with an ExportAwaiter: it answers via and bytes for
// ref "r1", nothing for any other.
type awaiter struct {
	fake
	via   string
	bytes int64
}

func (a *awaiter) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	if ref != "r1" {
		return "", 0, nil
	}
	return a.via, a.bytes, nil
}

// TestRemoteAwaitExport (issue 29): the wait for an export ahead crosses
// the bus with the object's reference and size; a driver that exports
// nothing ahead answers UNIMPLEMENTED, through Routed too.
func TestRemoteAwaitExport(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv.Connect(t), "n1", compute.Registry{"vm": &awaiter{via: "vmobj:sb1/snap:abc", bytes: 1 << 27}, "fake": &fake{}})
	s := spec("sb1", nil)
	routed := &compute.Routed{Local: "n0", Here: &fake{}, There: func(n string) compute.Driver { return remote.NewClient(srv.Conn, n, "vm") }}
	for _, c := range []struct {
		name  string
		d     compute.ExportAwaiter
		ref   string
		via   string
		bytes int64
	}{
		{"exported", remote.NewClient(srv.Conn, "n1", "vm"), "r1", "vmobj:sb1/snap:abc", 1 << 27},
		{"none", remote.NewClient(srv.Conn, "n1", "vm"), "r2", "", 0},
		{"routed", routed, "r1", "vmobj:sb1/snap:abc", 1 << 27},
	} {
		via, n, err := c.d.AwaitExport(ctx(t), s, c.ref)
		if err != nil || via != c.via || n != c.bytes {
			t.Errorf("%s: %q, %d, %v; want %q, %d", c.name, via, n, err, c.via, c.bytes)
		}
	}
	_, _, err := remote.NewClient(srv.Conn, "n1", "fake").AwaitExport(ctx(t), s, "r1")
	if !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
		t.Errorf("a driver that exports nothing ahead: %v (%s), want UNIMPLEMENTED", err, events.CodeOf(err))
	}
	here := &compute.Routed{Local: "n0", Here: &fake{}}
	own := compute.Spec{SandboxID: "sb1", Node: "n0"}
	if _, _, err := here.AwaitExport(ctx(t), own, "r1"); !errors.Is(err, compute.ErrUnimplemented) {
		t.Errorf("routed here to a driver that exports nothing ahead: %v, want UNIMPLEMENTED", err)
	}
}
